"""gatewaysite.logformat: the JSON line of any record, as GATEWAY_LOG_FORMAT=json prints it (pure)."""

import json
import logging
import os
import subprocess
import sys

from gatewaysite.logformat import JsonFormatter
from proxy.ledger.recorder import Fields


def _record(msg, *args, exc_info=None) -> logging.LogRecord:
    return logging.LogRecord("some.lib", logging.ERROR, __file__, 1, msg, args, exc_info)


def test_a_records_line_has_its_utc_time_level_logger_and_message_with_its_traceback():
    try:
        raise ValueError("boom")
    except ValueError:
        record = _record("failed %s", "here", exc_info=sys.exc_info())
    line = json.loads(JsonFormatter().format(record))
    assert (line["level"], line["logger"], line["message"]) == ("ERROR", "some.lib", "failed here")
    assert line["time"].endswith("+00:00")
    assert "ValueError: boom" in line["exc_info"] and "\n" not in JsonFormatter().format(record)


def test_an_events_fields_are_the_lines_own_and_print_as_json_in_text_too():
    event = Fields(event="request", time="2026-12-05T08:00:00.000+00:00", key="team-a")
    line = json.loads(JsonFormatter().format(_record(event)))
    assert line == {"time": "2026-12-05T08:00:00.000+00:00", "level": "ERROR", "logger": "some.lib", **event}
    text = logging.Formatter("%(message)s").format(_record(event))
    assert json.loads(text) == event


def test_pythons_warnings_are_printed_as_json_lines_too():
    """A library's warning goes through the log (`py.warnings`) in its format, not straight to stderr."""
    script = "import django, warnings; django.setup(); warnings.warn('a library warning', UserWarning)"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "gatewaysite.settings", "GATEWAY_LOG_FORMAT": "json"}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    (line,) = [json.loads(raw) for raw in done.stderr.splitlines()]
    assert (line["logger"], line["level"]) == ("py.warnings", "WARNING")
    assert "a library warning" in line["message"]


def test_an_event_without_its_own_time_gets_the_records_and_the_time_leads_the_line():
    record = _record(Fields(event="request", key="team-a"))
    record.created = 1_780_000_000.25
    text = JsonFormatter().format(record)
    assert json.loads(text)["time"] == "2026-05-28T20:26:40.250+00:00"
    assert text.startswith('{"time": ')
    timed = JsonFormatter().format(_record(Fields(event="request", time="2026-12-05T08:00:00.000+00:00")))
    assert timed.startswith('{"time": "2026-12-05T08:00:00.000+00:00", "level": "ERROR"')
