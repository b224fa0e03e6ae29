"""The report's cells: numbers formatted, medians looked up, targets judged, and the websocket phase's
figures and section.
"""

from __future__ import annotations

import math
from typing import Any

from bench import ws
from bench.targets import Scenario, Target

# --- report ------------------------------------------------------------------------------------


def fmt(v: float | None, digits: int = 2, unit: str = "") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    return f"{v:.{digits}f}{unit}"


def fmt_ratio(r: float | None) -> str:
    if r is None or math.isnan(r):
        return "n/a"
    return f"{r:.2f}x" if r >= 0.1 else f"{r:.2g}x"  # keep small ratios readable (0.0026x, not 0.00x)


def med(sc: Scenario, target: str) -> dict[str, Any] | None:
    return sc.results.get(target, {}).get("median")


def why_missing(sc: Scenario, target: str) -> str:
    res = sc.results.get(target)
    if res is None:
        return "not part of this scenario"
    return res.get("skipped", "no result")


def cell(sc: Scenario, target: str, key: str, digits: int = 2) -> str:
    m = med(sc, target)
    if m is None:
        return "n/a"
    text = fmt(m.get(key), digits)
    if m.get("errors_total"):
        text += f" ({m['errors_total']} err)"
    return text


def verdict(value: float | None, limit: float, kind: str, unit: str, note: str = "") -> str:
    """kind 'max': value <= limit; 'min': value >= limit."""
    if value is None or math.isnan(value):
        return "not measured" + (f": {note}" if note else "")
    if kind == "max":
        ok = value <= limit
        margin = limit - value
    else:
        ok = value >= limit
        margin = value - limit
    word = "**met**" if ok else "**MISSED**"
    how = f"{abs(margin):.2f}{unit} {'headroom' if ok else 'short'}"
    return f"{word}: {value:.2f}{unit} ({how})" + (f"; {note}" if note else "")


def ws_memory_figure(websocket: dict[str, Any], name: str) -> tuple[float | None, str]:
    """Memory per idle websocket for one gateway: the larger of the client kinds' figures, and a note
    that names both, or None and why there is no figure."""
    if "skipped" in websocket:
        return None, websocket["skipped"]
    mem = websocket.get("memory", {}).get(name)
    if mem is None:
        return None, "not part of the websocket phase"
    if "error" in mem:
        return None, mem["error"]
    parts, problems = [], []
    for k in mem["kinds"]:
        if k["open"] < k["asked"]:
            first = k["first_errors"][0] if k["first_errors"] else "no error recorded"
            problems.append(f"only {k['open']} of {k['asked']} opened ({first})")
        if k["upstream_ws_open_added"] != k["open"]:
            problems.append(f"{k['upstream_ws_open_added']} upstream websockets held for {k['open']} clients")
        parts.append(f"{fmt(k['per_connection_kib'], 1)} KiB when the client {k['client']}")
    if problems:
        return None, "; ".join(problems)
    values = [k["per_connection_kib"] for k in mem["kinds"] if k["per_connection_kib"] is not None]
    return (max(values) if values else None), "; ".join(parts)


def ws_added(websocket: dict[str, Any], mode: str, name: str, key: str = "p50_us") -> float | None:
    """Relay latency a gateway adds to an event (gateway minus direct), in microseconds."""
    by = websocket.get("latency", {}).get(mode, {})
    g, d = by.get(name, {}), by.get("direct", {})
    if "events" not in g or "events" not in d:
        return None
    return g["events"][key] - d["events"][key]


def ws_latency_note(websocket: dict[str, Any], name: str) -> str:
    if "skipped" in websocket:
        return websocket["skipped"]
    by = websocket.get("latency", {}).get("paced", {})
    for who in (name, "direct"):
        if "error" in by.get(who, {"error": "not measured"}):
            return f"{who}: {by.get(who, {}).get('error', 'not measured')}"
    return ""


def ws_report(websocket: dict[str, Any], gws: list[Target]) -> list[str]:
    """The report's websocket section (bench/ws.py measures it)."""
    L = ["## Websocket relay (`/v1/responses`, SPEC §6.3)", ""]
    if "skipped" in websocket:
        return [*L, f"Not measured: {websocket['skipped']}.", ""]
    n = websocket["idle_connections"]
    quick = (
        f" (**--quick**: {n} instead of the {websocket['target_idle_connections']} the target is stated for)"
        if websocket.get("quick")
        else ""
    )
    L.append(
        f"Idle websockets: {n} per kind of client{quick}, each after one whole response, so that each "
        "holds its live upstream websocket; the second kind is opened while the first kind's connections "
        "are still open. Per connection = growth of the gateway process's VmRSS / connections open. "
        f"Open-file limit of this run: {websocket['fd_limit'][0]} (raised to the hard limit; the servers "
        "inherit it)."
    )
    L.append("")
    L.append(
        "| server | client | idle websockets | upstream websockets held | gateway fds added "
        "| extension negotiated | RSS before (MiB) | RSS idle (MiB) | per connection (KiB) |"
    )
    L.append("|---|---|---|---|---|---|---|---|---|")
    closing: list[str] = []
    for g in gws:
        mem = websocket["memory"].get(g.name, {"error": "not measured"})
        if "error" in mem:
            L.append(f"| {g.label} | n/a: {mem['error']} | | | | | | | |")
            continue
        for k in mem["kinds"]:
            negotiated = ", ".join(f"{ext} x{c}" for ext, c in sorted(k["negotiated"].items())) or "n/a"
            errors = f" ({k['errors']} failed)" if k["errors"] else ""
            rss_before, rss_idle = k["before"]["rss_kib"], k["idle"]["rss_kib"]
            L.append(
                f"| {g.label} | {k['client']} | {k['open']} of {k['asked']}{errors} "
                f"| +{k['upstream_ws_open_added']} | +{k['fds_added']} | {negotiated} "
                f"| {fmt(rss_before / 1024 if rss_before else None, 1)} "
                f"| {fmt(rss_idle / 1024 if rss_idle else None, 1)} | {fmt(k['per_connection_kib'], 1)} |"
            )
        start, after = mem["start"], mem["after_close"]
        back = (
            "back to where they were" if mem["upstream_ws_open_back"] else "**not** back to where they were"
        )
        closing.append(
            f"- {g.label}: after closing all {mem['closed_all']}, the upstreams' open websockets are {back} "
            f"({start['upstream_ws_open']} -> {after['upstream_ws_open']}), the gateway's descriptors "
            f"{after['fds']} against {start['fds']} at the start, RSS "
            f"{fmt((after['rss_kib'] or 0) / 1024, 1)} MiB (freed memory stays with the Python process)."
        )
    L.append("")
    L.extend(closing)
    L.append("")
    L.append(
        "uvicorn negotiates permessage-deflate with every client that offers it (`--ws-per-message-deflate` "
        "defaults to true). This run starts uvicorn as the README recommends, "
        "`uvicorn gatewaysite.asgi:application --loop uvloop --http httptools`, with no websocket option: "
        'the "offers permessage-deflate" rows show what compression costs an idle connection there, and '
        'the "offers no compression" rows what every connection costs when uvicorn is started with '
        "`--ws-per-message-deflate false` (a server that negotiates nothing holds no compression state). "
        'The "extension negotiated" column shows what each server agreed to. The target row takes the '
        "larger of the two figures."
    )
    L.append("")
    lat = websocket.get("latency", {})
    labels = {"direct": "direct (fast upstream)", **{g.name: g.label for g in gws}}
    for mode, title in (
        (
            "paced",
            f"upstream waits {websocket['pace_ms']:g} ms before each delta, as a model streams tokens",
        ),
        ("burst", "upstream writes every event back to back (later events queue behind earlier ones)"),
    ):
        by = lat.get(mode, {})
        L.append(f"### Relay latency per event, {mode}: {title}")
        L.append("")
        L.append(
            f"{websocket['deltas']} deltas per response, {websocket['responses_per_rep']} responses x "
            f"{websocket['reps']} repetitions per target on one kept-open connection (after "
            f"{ws.WARMUP_RESPONSES} warm-up responses); a delta's latency is the time from the upstream's "
            "write to the client's read; added = target minus direct."
        )
        L.append("")
        L.append(
            "| target | deltas | p50 (us) | p90 (us) | p99 (us) | added p50 (us) | added p99 (us) "
            "| p50 per repetition (us) | response.completed p50 (us) | create -> completed p50 (ms) "
            "| server CPU ms / response | extension |"
        )
        L.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for name, label in labels.items():
            r = by.get(name)
            if r is None or "error" in r:
                L.append(f"| {label} | n/a: {(r or {}).get('error', 'not measured')} | | | | | | | | | | |")
                continue
            ev = r["events"]
            added = "" if name == "direct" else fmt(ws_added(websocket, mode, name), 1)
            added99 = "" if name == "direct" else fmt(ws_added(websocket, mode, name, "p99_us"), 1)
            errors = f" ({r['errors']} err: {r['first_error']})" if r["errors"] else ""
            reps = ", ".join(fmt(v, 0) for v in r["rep_p50_us"])
            L.append(
                f"| {label} | {ev['count']}{errors} | {fmt(ev['p50_us'], 1)} | {fmt(ev['p90_us'], 1)} "
                f"| {fmt(ev['p99_us'], 1)} | {added} | {added99} | {reps} "
                f"| {fmt(r['terminal']['p50_us'], 1)} "
                f"| {fmt(r['round_trip']['p50_us'] / 1000, 2)} | {fmt(r['cpu_ms_per_response'], 2)} "
                f"| {r['negotiated']} |"
            )
        L.append("")
    L.append(
        "The gateway settles a response before it relays the terminal event (proxy/output.py "
        "`AttemptStream._relay`: the response-id affinity is written and the ledger row handed over first, "
        "so that a continuation sent at once finds them), so `response.completed` takes longer than a delta; "
        "create -> completed also holds the routing of the frame. Neither is part of the per-event target."
    )
    L.append("")
    return L
