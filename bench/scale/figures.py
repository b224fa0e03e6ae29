"""`make bench-scale`'s figures from its raw results (pure): each curve's rows, size by size, each figure
beside the smallest size's, and the verdicts against issue 49's targets.

A row is (label, [cell per size]); a verdict is (target, limit, met or None when it could not be
measured, the figure in words).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Verdict = tuple[str, str, bool | None, str]


@dataclass(frozen=True)
class Curve:
    name: str
    title: str
    sizes: list[str]  # each size as the table heads it
    rows: list[tuple[str, list[str]]]
    verdicts: list[Verdict]
    plot: dict[str, list[float | None]]  # series name -> one value per size (None: not measured)
    x: list[float]  # the sizes as numbers, for the plot
    y_label: str
    limit: float | None = None  # a horizontal line on the plot
    log_y: bool = False  # figures of different magnitudes on one plot
    ticks: list[str] | None = None  # the sizes as the plot's axis reads them (short)
    headline: str = ""  # the label of the row bench/results.md's summary shows, smallest and largest size


def short(n: int) -> str:
    """A size as an axis reads it: 0, 10, 10k, 1M."""
    for size, suffix in ((1_000_000, "M"), (1_000, "k")):
        if n >= size:
            return f"{n / size:g}{suffix}"
    return str(n)


def fmt(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def change(value: float | None, base: float | None) -> float | None:
    """value against base, as a fraction (+0.05: 5 % more); None when either is missing or base is 0."""
    if value is None or base is None or base == 0:
        return None
    return value / base - 1


def beside(values: list[float | None], digits: int = 2, unit: str = "") -> list[str]:
    """Each value with its change against the first (the smallest size)."""
    out = []
    for i, v in enumerate(values):
        c = change(v, values[0]) if i else None
        out.append(fmt(v, digits) + unit + ("" if c is None else f" ({c * 100:+.1f} %)"))
    return out


def within(values: list[float | None], limit: float) -> tuple[bool | None, str]:
    """Is the largest size's figure within `limit` (a fraction) of the smallest's?"""
    c = change(values[-1], values[0])
    if c is None:
        return None, "not measured"
    return c <= limit, f"{c * 100:+.1f} %"


def _median(load: dict[str, Any], scenario: str, name: str) -> dict[str, Any]:
    found = load.get(scenario, {}).get(name, {})
    return found if "p50_ms" in found else {}


def added_p50(load: dict[str, Any], name: str) -> float | None:
    gw, direct = _median(load, "c1", name), _median(load, "c1", "direct")
    return gw["p50_ms"] - direct["p50_ms"] if gw and direct else None


def cpu_per_request(load: dict[str, Any], scenario: str, name: str) -> tuple[float | None, float | None]:
    """(gateway processes, PostgreSQL backends) CPU ms per answered request."""
    m = _median(load, scenario, name)
    return m.get("cpu_ms_per_req"), m.get("db_cpu_ms_per_req")


def _total(parts: tuple[float | None, float | None]) -> float | None:
    return None if parts[0] is None or parts[1] is None else parts[0] + parts[1]


def request_path(load: dict[str, Any], names: list[str]) -> dict[str, list[float | None]]:
    """Per size: added p50 at c=1, CPU per request at c=16 (gateway, database, both), req/s at c=16."""
    cpu = [cpu_per_request(load, "c16", n) for n in names]
    return {
        "added_p50": [added_p50(load, n) for n in names],
        "cpu_gateway": [c[0] for c in cpu],
        "cpu_db": [c[1] for c in cpu],
        "cpu": [_total(c) for c in cpu],
        "rps": [_median(load, "c16", n).get("rps") for n in names],
    }


CPU_ROW = "CPU per request, c=16: gateway + PostgreSQL (ms)"


def request_rows(path: dict[str, list[float | None]]) -> list[tuple[str, list[str]]]:
    return [
        ("added latency p50, c=1 (ms)", beside(path["added_p50"], 3)),
        (CPU_ROW, beside(path["cpu"], 3)),
        ("&nbsp;&nbsp;gateway processes (ms)", beside(path["cpu_gateway"], 3)),
        ("&nbsp;&nbsp;PostgreSQL backends (ms)", beside(path["cpu_db"], 3)),
        ("throughput, c=16 (req/s)", beside(path["rps"], 0)),
    ]


def path_verdicts(path: dict[str, list[float | None]], largest: str, limit: float) -> list[Verdict]:
    out = []
    for key, what in (("added_p50", "added latency p50"), ("cpu", "CPU per request")):
        met, said = within(path[key], limit)
        out.append((f"{what} at {largest}", f"within {limit * 100:.0f} % of the smallest", met, said))
    return out


def keys_curve(raw: dict[str, Any]) -> Curve:
    sizes = raw["sizes"]
    path = request_path(raw["load"], [f"keys-{n}" for n in sizes])
    return Curve(
        "keys",
        "Keys",
        [f"{n:,} keys" for n in sizes],
        request_rows(path),
        path_verdicts(path, f"{sizes[-1]:,} keys", 0.05),
        {"added p50, c=1 (ms)": path["added_p50"], "CPU per request, c=16 (ms)": path["cpu"]},
        [float(n) for n in sizes],
        "ms",
        ticks=[short(n) for n in sizes],
        headline=CPU_ROW,
    )


def _probe(probes: dict[str, Any], size: int, *path: str) -> Any:
    found: Any = probes.get(str(size), probes.get(size, {}))  # type: ignore[call-overload]
    for part in path:
        if not isinstance(found, dict) or part not in found:
            return None
        found = found[part]
    return found


def accounts_curve(raw: dict[str, Any]) -> Curve:
    sizes, probes = raw["sizes"], raw["probes"]
    path = request_path(raw["load"], [f"accounts-{n}" for n in sizes])

    def series(*p: str) -> list[Any]:
        return [_probe(probes, n, *p) for n in sizes]

    decision, statement = series("decision_us"), series("statement_ms")
    panel, explain = series("panel", "ms"), series("routing_explain", "ms")
    panel_q, explain_q = series("panel", "queries"), series("routing_explain", "queries")
    rows = [
        *request_rows(path),
        ("routing decision (`decide`, in process, us)", beside(decision, 0)),
        ("&nbsp;&nbsp;candidates for the model", [fmt(v, 0) for v in series("candidates")]),
        ("the request's statement, EXPLAIN ANALYZE execution (ms)", beside(statement, 3)),
        ("&nbsp;&nbsp;rows it returns", [fmt(v, 0) for v in series("statement_rows")]),
        (
            "&nbsp;&nbsp;the same reading its latency rows (at most every 0.1 s), ms; rows",
            [
                f"{fmt(ms, 3)}; {fmt(n, 0)}"
                for ms, n in zip(
                    series("figures_statement_ms"), series("figures_statement_rows"), strict=True
                )
            ],
        ),
        (
            "/admin/upstreams/ (ms; queries)",
            [f"{a}; {fmt(q, 0)}" for a, q in zip(beside(panel, 0), panel_q, strict=True)],
        ),
        (
            "`routing_explain` (ms; queries)",
            [f"{a}; {fmt(q, 0)}" for a, q in zip(beside(explain, 0), explain_q, strict=True)],
        ),
    ]
    verdicts = path_verdicts(path, f"{sizes[-1]} accounts", 0.10)
    worst = panel[-1]
    verdicts.append(
        (
            f"/admin/upstreams/ at {sizes[-1]} accounts",
            "under 1 s",
            None if worst is None else worst < 1000,
            f"{fmt(worst, 0)} ms",
        )
    )
    for what, counts in (("/admin/upstreams/", panel_q), ("`routing_explain`", explain_q)):
        known = [q for q in counts if q is not None]
        verdicts.append(
            (
                f"{what} queries",
                "the same at every size",
                bool(known) and len(set(known)) == 1 and len(known) == len(counts),
                " / ".join(fmt(q, 0) for q in counts),
            )
        )
    return Curve(
        "accounts",
        "Accounts",
        [f"{n} accounts x 20 models" for n in sizes],
        rows,
        verdicts,
        {
            "added p50, c=1 (ms)": path["added_p50"],
            "CPU per request, c=16 (ms)": path["cpu"],
            "decision (ms)": [None if d is None else d / 1000 for d in decision],
        },
        [float(n) for n in sizes],
        "ms",
        ticks=[short(n) for n in sizes],
        headline=CPU_ROW,
    )


PAGES = (
    ("request_list", "request list"),
    ("request_page", "a request's page"),
    ("spend", "spend page"),
    ("upstreams", "/admin/upstreams/ (its per-model leaderboard)"),
)
PAGE_LIMIT_MS = 500


def history_curve(raw: dict[str, Any]) -> Curve:
    sizes, probes = raw["sizes"], raw["probes"]
    path = request_path(raw["load"], [f"history-{n}" for n in sizes])
    rows = request_rows(path)
    verdicts = path_verdicts(path, f"{sizes[-1]:,} records", 0.05)
    plot: dict[str, list[float | None]] = {}
    for key, label in PAGES:
        ms = [_probe(probes, n, key, "ms") for n in sizes]
        queries = [_probe(probes, n, key, "queries") for n in sizes]
        rows.append(
            (
                f"{label} (ms; queries)",
                [f"{a}; {fmt(q, 0)}" for a, q in zip(beside(ms, 0), queries, strict=True)],
            )
        )
        plot[label] = ms
        worst = ms[-1]
        verdicts.append(
            (
                f"{label} at {sizes[-1]:,} records",
                f"under {PAGE_LIMIT_MS} ms",
                None if worst is None else worst < PAGE_LIMIT_MS,
                f"{fmt(worst, 0)} ms",
            )
        )
    prune = [_probe(probes, n, "prune", "ms") for n in sizes]
    said = [_probe(probes, n, "prune", "said") or "" for n in sizes]
    rows.append(("`prune_ledger` of one day (s)", [fmt(None if p is None else p / 1000, 1) for p in prune]))
    rows.append(("&nbsp;&nbsp;it said", [s.split(" started")[0] for s in said]))
    return Curve(
        "history",
        "History",
        [f"{n:,} records" for n in sizes],
        rows,
        verdicts,
        plot,
        [float(max(n, 1)) for n in sizes],
        "ms",
        PAGE_LIMIT_MS,
        log_y=True,
        ticks=[short(n) for n in sizes],
        headline="spend page (ms; queries)",
    )


STREAM_CPU_ROW = "gateway CPU per relayed event, its idle CPU subtracted (us)"


def streams_curve(raw: dict[str, Any]) -> Curve:
    sizes, levels = raw["sizes"], raw["levels"]

    def side(side_name: str, key: str) -> list[Any]:
        return [levels.get(str(n), levels.get(n, {})).get(side_name, {}).get(key) for n in sizes]  # type: ignore[call-overload]

    cpu, rss = side("gateway", "cpu_us_per_event"), side("gateway", "rss_per_stream_kib")
    g50, d50 = side("gateway", "latency_p50_ms"), side("direct", "latency_p50_ms")
    g99, d99 = side("gateway", "latency_p99_ms"), side("direct", "latency_p99_ms")
    added50 = [None if g is None or d is None else g - d for g, d in zip(g50, d50, strict=True)]
    added99 = [None if g is None or d is None else g - d for g, d in zip(g99, d99, strict=True)]
    cut, stalled, gap = side("gateway", "cut"), side("gateway", "stalled"), side("gateway", "max_gap_s")
    refused = [r or 0 for r in side("gateway", "refused")]
    why = [", ".join(e or []) for e in side("gateway", "refused_examples")]
    rows = [
        (STREAM_CPU_ROW, beside(cpu, 1)),
        ("&nbsp;&nbsp;not subtracted (us)", beside(side("gateway", "cpu_us_per_event_raw"), 1)),
        (
            "the gateway's CPU in the window (share of one core)",
            [fmt(v) for v in side("gateway", "cpu_busy")],
        ),
        ("gateway memory per open stream (KiB)", beside(rss, 1)),
        ("added latency per event p50 (ms)", beside(added50, 3)),
        ("added latency per event p99 (ms)", beside(added99, 3)),
        (
            "&nbsp;&nbsp;direct p50 / p99 (ms)",
            [f"{fmt(a, 3)} / {fmt(b, 3)}" for a, b in zip(d50, d99, strict=True)],
        ),
        (
            "streams refused before their first event (why)",
            [f"{r}" + (f" ({w})" if w else "") for r, w in zip(refused, why, strict=True)],
        ),
        (
            "streams cut / stalled (longest gap, s)",
            [f"{fmt(c, 0)} / {fmt(s, 0)} ({fmt(g, 2)})" for c, s, g in zip(cut, stalled, gap, strict=True)],
        ),
    ]
    # Flat: no size's CPU per event more than 20 % above the smallest size's (a falling cost, events read
    # in batches as streams are added, is flat enough: what must not happen is a cost that grows).
    rise = [change(c, cpu[0]) for c in cpu[1:]]
    known = [r for r in rise if r is not None]
    verdicts: list[Verdict] = [
        (
            "gateway CPU per relayed event",
            "at every size at most 20 % above the smallest size's",
            None if not rise or len(known) < len(rise) else max(known) <= 0.20,
            " / ".join("n/a" if r is None else f"{r * 100:+.1f} %" for r in rise) or "n/a",
        ),
        (
            "streams refused, cut or stalled",
            "none",
            None if None in cut else sum(cut) + sum(stalled) + sum(refused) == 0,
            f"{sum(refused)} refused, {sum(c or 0 for c in cut)} cut, {sum(s or 0 for s in stalled)} stalled",
        ),
    ]
    idle = raw.get("idle", {})
    kinds = idle.get("kinds") or [{}]
    per = kinds[0].get("per_connection_kib")
    verdicts.append(
        (
            f"memory per idle websocket with its upstream connection, {kinds[0].get('open', 0):,} open",
            "<= 100 KiB",
            None if per is None else per <= 100,
            f"{fmt(per, 1)} KiB (client offers permessage-deflate; upstream websockets +"
            f"{kinds[0].get('upstream_ws_open_added')}, errors {kinds[0].get('errors')})",
        )
    )
    return Curve(
        "streams",
        "Streams",
        [f"{n:,} stream{'' if n == 1 else 's'}" for n in sizes],
        rows,
        verdicts,
        {"CPU per event (us)": cpu, "memory per stream (KiB)": rss},
        [float(n) for n in sizes],
        "us / KiB",
        log_y=True,
        ticks=[short(n) for n in sizes],
        headline=STREAM_CPU_ROW,
    )


def workers_figures(raw: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """Per gateway of the workers curve: c=64 throughput, CPU per request and requests per CPU core."""
    load = raw["load"]
    out: dict[str, dict[str, float | None]] = {}
    for name in ("workers-1", "workers-2", "workers-1-limits"):
        gw, db = cpu_per_request(load, "c64", name)
        out[name] = {
            "rps_c16": _median(load, "c16", name).get("rps"),
            "rps_c64": _median(load, "c64", name).get("rps"),
            "cpu_gateway": gw,
            "cpu_db": db,
            "per_gateway_core": None if not gw else 1000 / gw,
            "per_db_core": None if not db else 1000 / db,
        }
    return out


def paper(found: dict[str, dict[str, float | None]], node_cores: int = 16, nodes: int = 4) -> dict[str, Any]:
    """From the measured CPU per request: what a node of `node_cores` cores answers, what one PostgreSQL
    core carries, how many such nodes a database of `node_cores` cores serves, and with limits counted
    in the database instead of Redis. Upper bounds: every core busy, CPU per request as measured here."""
    two, limits = found["workers-2"], found["workers-1-limits"]
    if not two["cpu_gateway"] or not two["cpu_db"]:
        return {}
    node = node_cores * 1000 / two["cpu_gateway"]
    per_db_core = 1000 / two["cpu_db"]
    out = {
        "node_rps": node,
        "fleet_rps": nodes * node,
        "db_cores_for_fleet": nodes * node / per_db_core,
        "nodes_per_db": node_cores * per_db_core / node,
    }
    if limits["cpu_db"] and found["workers-1"]["cpu_db"]:
        extra = limits["cpu_db"] - found["workers-1"]["cpu_db"]
        out["limits_db_ms"] = extra
        out["nodes_per_db_with_db_limits"] = node_cores * 1000 / (two["cpu_db"] + max(extra, 0)) / node
    return out
