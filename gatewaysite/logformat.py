"""How the process prints its log lines (issue 47 point 4). `GATEWAY_LOG_FORMAT=json` (the default when
DEBUG is off, as in production): every line of every logger, the gateway's, Django's and uvicorn's, is one
JSON object with its time (ISO 8601, UTC), level and logger; `text`: the message alone, as a terminal
wants it.

A structured event (the ledger's per-request and per-failed-attempt lines, `proxy.ledger.recorder.Fields`) is
logged as a dict: its fields become the JSON object's own (its `time` wins over the record's), and in
text it prints as JSON.
"""

import json
import logging
from datetime import UTC, datetime

# `json.dumps(line, default=str)` makes an encoder for every call; one made once writes the same text.
_ENCODE = json.JSONEncoder(default=str).encode


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, then the event's fields or its `message`
    (and its traceback as `exc_info`, as `logging` would print it: gatewaysite.logsafe applies)."""

    def format(self, record: logging.LogRecord) -> str:
        msg = record.msg
        event = isinstance(msg, dict) and not record.args
        line: dict[str, object] = {"time": None, "level": record.levelname, "logger": record.name}
        if event:
            line.update(msg)
        else:
            line["message"] = record.getMessage()
        # An event's own time wins, so the record's is formatted only for a line without one (a third of
        # the request line's formatting, bench/profile.md).
        if not event or "time" not in msg:
            line["time"] = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exc_info"] = record.exc_text
        if record.stack_info:
            line["stack_info"] = self.formatStack(record.stack_info)
        return _ENCODE(line)
