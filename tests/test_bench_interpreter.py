"""bench/interpreter.py: which CPython `make bench` measures on, and the venv it keeps for it."""

import os
import sys
from pathlib import Path

from bench.interpreter import Interpreter, choose, main, probe, venv_base

BASE = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def _i(name: str, probe_ms: float) -> Interpreter:
    return Interpreter(name, f"/opt/{name}", (3, 11), probe_ms)


def test_python3_is_kept_unless_another_is_clearly_faster():
    default = _i("python3", 10.0)
    assert choose(default, [_i("a", 9.6), _i("b", 9.8)]) == default  # 4 % faster: not enough
    assert choose(default, [_i("a", 9.4), _i("b", 7.0)]) == _i("b", 7.0)  # the fastest, not the first
    assert choose(default, []) == default


def test_without_python3_the_fastest_found_is_chosen():
    assert choose(None, [_i("a", 5.0), _i("b", 4.0)]) == _i("b", 4.0)
    assert choose(None, []) is None


def test_a_venvs_interpreter_is_refused_and_its_base_is_reported():
    # A venv made from another venv's interpreter would hide which build it runs on.
    assert sys.prefix != sys.base_prefix, "the suite runs in the project's venv"
    assert probe(sys.executable) is None
    base = probe(BASE)
    assert base is not None
    assert base.executable == BASE
    assert base.version >= (3, 11)
    assert base.probe_ms > 0


def test_probe_refuses_what_is_not_a_usable_interpreter(tmp_path):
    fake = tmp_path / "python3"
    fake.write_text("#!/bin/sh\necho '{\"nope\": 1}'\n")
    fake.chmod(0o755)
    assert probe(str(fake)) is None
    assert probe(str(tmp_path / "missing")) is None


def _venv(path: Path, executable: str) -> Path:
    path.mkdir()
    (path / "pyvenv.cfg").write_text(f"home = /x\nexecutable = {executable}\n")
    return path


def test_a_venv_made_from_another_interpreter_is_removed(tmp_path, capsys):
    venv = _venv(tmp_path / "made-elsewhere", "/opt/some/other/python3.11")
    assert venv_base(venv) == "/opt/some/other/python3.11"
    assert main(["--use", BASE, "--venv", str(venv)]) == 0
    assert capsys.readouterr().out.strip() == BASE
    assert not venv.exists()


def test_a_venv_made_from_the_chosen_interpreter_is_kept(tmp_path, capsys):
    venv = _venv(tmp_path / "made-here", BASE)
    assert main(["--use", BASE, "--venv", str(venv)]) == 0
    assert capsys.readouterr().out.strip() == BASE
    assert (venv / "pyvenv.cfg").exists()
    assert venv_base(tmp_path / "no-venv") is None


def test_an_unusable_choice_fails_and_prints_no_interpreter(tmp_path, capsys):
    assert main(["--use", str(tmp_path / "missing")]) == 1
    assert capsys.readouterr().out == ""
