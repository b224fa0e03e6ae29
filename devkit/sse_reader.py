"""A minimal SSE reader for what the gateway sent, independent of the gateway's own parser
(`proxy.wire.sse`), so the end-to-end tests and the soak check its output against a second reading."""

import json
from typing import Any


def read_sse(text: str) -> list[tuple[str | None, Any]]:
    """(event name, data) of each SSE block with data; the data parsed as JSON when it is JSON
    (`[DONE]` stays a string). Comments and data-less blocks are skipped."""
    events = []
    for block in text.replace("\r\n", "\n").replace("\r", "\n").split("\n\n"):
        name, data = None, []
        for line in block.split("\n"):
            if not line or line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "event":
                name = value
            elif field == "data":
                data.append(value)
        if not data:
            continue
        raw = "\n".join(data)
        try:
            parsed: Any = json.loads(raw)
        except ValueError:
            parsed = raw
        events.append((name, parsed))
    return events
