"""The repository's documents are self-contained (issue 47 point 8): every link of README.md, docs/ and
the other Markdown files in the repository points at a file of the repository that exists, and at a
heading that file has; none leaves the repository (a clone has nothing beside it)."""

import re
import subprocess
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parent.parent
LINK = re.compile(r"(?<!\!)\[[^\]]*\]\(([^)\s]+)\)")


def _documents() -> list[Path]:
    tracked = subprocess.run(
        ["git", "ls-files", "*.md"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    return sorted(
        {REPO / name for name in tracked} | set((REPO / "docs").glob("*.md")) | {REPO / "README.md"}
    )


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {_slug(m) for m in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def _problems(document: Path) -> list[str]:
    problems = []
    text = re.sub(r"```.*?```", "", document.read_text(), flags=re.S)  # code is not a link
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("/"):
            problems.append(f"{target}: leaves the repository")
            continue
        path, _, anchor = target.partition("#")
        resolved = (document.parent / unquote(path)).resolve() if path else document
        if not resolved.is_relative_to(REPO):
            problems.append(f"{target}: leaves the repository")
        elif not resolved.exists():
            problems.append(f"{target}: no such file")
        elif anchor and (resolved.suffix != ".md" or anchor not in _anchors(resolved)):
            problems.append(f"{target}: no such heading")
    return problems


@pytest.mark.parametrize("document", _documents(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_stays_in_the_repository_and_arrives(document):
    assert _problems(document) == []


def test_the_checker_finds_each_kind_of_broken_link(tmp_path, monkeypatch):
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A title\n")
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](docs/a.md) [ok](docs/a.md#a-title) [ok](#here)\n## Here\n"
        "[spec](../shared/SPEC.md) [web](https://example.com/) [abs](/etc/passwd) "
        "[gone](docs/b.md) [anchor](docs/a.md#nowhere)\n```\n[code](../not-a-link.md)\n```\n"
    )
    assert _problems(page) == [
        "../shared/SPEC.md: leaves the repository",
        "https://example.com/: leaves the repository",
        "/etc/passwd: leaves the repository",
        "docs/b.md: no such file",
        "docs/a.md#nowhere: no such heading",
    ]
