"""`make bench-pool`'s report: bench/pool.md, and its summary in bench/results.md.

`make bench-pool` writes bench/pool.md (every figure and its target) and replaces its section of
bench/results.md with a summary (the targets met with the pool features on and off, the missed ones by
name, a link to bench/pool.md), so that bench/results.md shows the pool's verdicts without a rerun of
the benchmark and stays short (issue 46: under 200 lines). `make bench` rewrites bench/results.md and
carries that section over as it is (`kept`, bench/report.py).
"""

from __future__ import annotations

import datetime as dt
import os
import platform
from pathlib import Path
from typing import Any

from bench.pool import workload
from bench.pool.figures import PROBE_S
from bench.targets import POOL_MD, RESULTS_MD, git_commit
from devkit.pool_upstream import AccountSpec

HEADING = "## Pool (make bench-pool)"


def context(
    root: Path,
    quick: bool,
    s: workload.Settings,
    pace: workload.Pace,
    specs: list[AccountSpec],
    circuit: dict[str, int],
    retry: dict[str, int],
) -> dict[str, Any]:
    cpu_model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "unknown CPU",
    )
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_commit(root),
        "machine": f"{os.cpu_count()} CPUs ({cpu_model}), Linux {platform.release()}, "
        f"Python {platform.python_version()}",
        "load_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "quick": quick,
        "settings": s.__dict__,
        "pace": {
            **pace.__dict__,
            "share_of_requests": pace.share_of_requests,
            "share_of_tokens": pace.share_of_tokens,
        },
        "accounts": len(specs),
        "steady": len(workload.steady(specs)),
        "heals": workload.heals(specs),
        "circuit": circuit,
        "retry": retry,
    }


def verdict(value: float | None, limit: float, text: str) -> str:
    if value is None:
        return f"**MISSED**: {text}"
    return f"**{'met' if value <= limit else 'MISSED'}**: {text}"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _cpu(phase: dict[str, Any]) -> float | None:
    cpu = phase["cpu_ms"]
    return None if cpu["gateway"] is None or cpu["postgres"] is None else cpu["gateway"] + cpu["postgres"]


def rows(ctx: dict[str, Any], phases: dict[str, dict[str, Any]]) -> list[tuple[str, str, list[str]]]:
    on, off = phases["on"], phases["off"]
    found: list[tuple[str, str, list[str]]] = []

    def each(fn: Any) -> list[str]:
        return [fn(on), fn(off)]

    found.append(
        ("turns sent (answered 200)", "", each(lambda p: f"{p['client']['sent']} ({p['client']['ok']})"))
    )
    found.append(
        (
            "client-visible 429",
            "0",
            each(lambda p: verdict(p["client"]["rate_limited"], 0, str(p["client"]["rate_limited"]))),
        )
    )
    found.append(
        (
            "client-visible `no_eligible_backend`",
            "0",
            each(
                lambda p: verdict(
                    p["client"]["no_eligible_backend"], 0, str(p["client"]["no_eligible_backend"])
                )
            ),
        )
    )
    found.append(
        (
            "other client-visible failures (status code: count)",
            "",
            each(
                lambda p: (
                    ", ".join(
                        f"{k}: {v}" for k, v in p["client"]["failures"].items() if not k.startswith("429")
                    )
                    or "none"
                )
            ),
        )
    )
    found.append(
        (
            "429s the accounts answered (absorbed by the gateway unless counted above)",
            "",
            each(lambda p: f"{p['upstream_429']} of {p['upstream_requests']} upstream requests"),
        )
    )
    found.append(
        (
            f"busiest of the {ctx['steady']} steady accounts, over the fair share",
            "<= 1.3x",
            each(
                lambda p: verdict(
                    p["busiest"]["share"],
                    1.3,
                    f"{p['busiest']['share']:.2f}x ({p['busiest']['busiest']}: "
                    f"{p['busiest']['served']} served, fair {p['busiest']['fair']:.0f}; "
                    f"{p['busiest']['idle']} idle)"
                    if p["busiest"]["share"] is not None
                    else "nothing served",
                )
            ),
        )
    )
    for name, healed in ctx["heals"].items():
        found.append(
            (
                f"`{name}` healed at {healed:.0f} s: first request served after (cooldown in force then)",
                f"<= that cooldown + {PROBE_S:.0f} s",
                each(lambda p, n=name: heal_cell(p["heals"][n])),
            )
        )
    found.append(
        (
            "affinity hit rate, previous turn's account healthy",
            ">= 95 %",
            each(
                lambda p: verdict(
                    None if p["affinity"]["rate"] is None else -p["affinity"]["rate"],
                    -0.95,
                    f"{_pct(p['affinity']['rate'])} of {p['affinity']['counted']} turns",
                )
            ),
        )
    )
    for kind in workload.KINDS:
        found.append(
            (
                f"&nbsp;&nbsp;by {workload.KIND_NAMES[kind]}",
                "",
                each(
                    lambda p, k=kind: (
                        "{:.1%} of {}".format(*p["affinity"]["by_kind"][k])
                        if k in p["affinity"]["by_kind"]
                        else "n/a"
                    )
                ),
            )
        )
    found.append(("cached input tokens / input tokens", "", each(lambda p: _pct(p["cached_share"]))))
    found.append(
        (
            "gateway CPU per request: 2 workers + PostgreSQL backends",
            "",
            each(
                lambda p: (
                    "n/a"
                    if _cpu(p) is None
                    else f"{_cpu(p):.2f} ms ({p['cpu_ms']['gateway']:.2f} + {p['cpu_ms']['postgres']:.2f})"
                )
            ),
        )
    )
    cpu_on, cpu_off = _cpu(on), _cpu(off)
    if cpu_on is not None and cpu_off is not None:
        change = cpu_on / cpu_off - 1
        found.append(
            (
                "&nbsp;&nbsp;features on against off, same load",
                "<= +5 %",
                [verdict(change, 0.05, f"{change:+.1%}"), ""],
            )
        )
    return found


def heal_cell(heal: dict[str, Any]) -> str:
    """`figures.heal_times`' judgement of one healed account, with the cooldown it was judged by."""
    after = "never" if heal["after_s"] is None else f"{heal['after_s']:.1f} s"
    if heal["cooldown_s"]:
        why = f"cooldown {heal['cooldown_s']} s"
    elif heal["first_new_s"] is None:
        why = "circuit closed; no new conversation after the heal"
    else:
        why = f"circuit closed; the first new conversation came {heal['first_new_s']:.1f} s after the heal"
    return f"**{'met' if heal['met'] else 'MISSED'}**: {after} ({why})"


def render(ctx: dict[str, Any], phases: dict[str, dict[str, Any]]) -> str:
    pace, s = ctx["pace"], ctx["settings"]
    circuit, retry = ctx["circuit"], ctx["retry"]
    lines = [
        HEADING,
        "",
        f"Written by `make bench-pool` (bench/pool/run.py{', `--quick`' if ctx['quick'] else ''}) on "
        f"{ctx['date']}, commit {ctx['commit']}, in {ctx.get('elapsed_s', '?')} s; {ctx['machine']}, load "
        f"average {ctx['load_start']} at start (a machine shared with other work: noisy figures).",
        "",
        f"{ctx['accounts']} fake accounts (devkit/pool_upstream.py; {workload.RPM} requests and "
        f"{workload.TPM:,} tokens a minute each, 5 of them Anthropic-shaped): {ctx['steady']} steady, "
        f"`{workload.UNAVAILABLE}` answering 503 and `{workload.UNAUTHORIZED}` 401 for {s['outage_s']:.0f} s "
        f"each, `{workload.HUNG}` hung throughout. {s['slots']} clients, open loop, "
        f"{pace['rate']:.1f} turns/s for {s['duration_s']:.0f} s, conversations of {s['turns']} turns over "
        f"their own ~20k-token system prompt ({pace['turn_tokens']:,.0f} tokens a turn on average): "
        f"{pace['share_of_tokens']:.0%} of the steady accounts' tokens a minute, "
        f"{pace['share_of_requests']:.0%} of their requests. Gateway: 2 uvicorn workers on PostgreSQL, "
        f"`cooldown_seconds: {circuit['cooldown_seconds']}` (doubled by each failed probe, at most "
        f"{circuit['max_cooldown_seconds']}), "
        f"`failure_threshold: {circuit['failure_threshold']}`, "
        f"`default_deadline_ms: {retry['default_deadline_ms']}`, `max_attempts: {retry['max_attempts']}`. "
        '"off" is the same run with `GATEWAY_POOL_FEATURES=false`.',
        "",
        "| figure | target | features on | features off |",
        "|---|---|---|---|",
    ]
    lines += [f"| {name} | {target} | {' | '.join(cells)} |" for name, target, cells in rows(ctx, phases)]
    missed = sum(cell.startswith("**MISSED**") for _, _, cells in rows(ctx, phases) for cell in cells[:1])
    lines += [
        "",
        f"Targets with the features on: {'all met' if not missed else f'{missed} missed'}. Affinity counts a "
        "turn served by the account of the conversation's previous turn, among turns whose previous account "
        "had no outage scheduled and answered no 429 in between; heal times are from the accounts' own "
        "records, the cooldown in force from the gateway's circuit rows (read every 0.5 s; an open "
        "period's start is its `open_until` less its cooldown). The CPU target is about the pool features' "
        "cost on the hot path: that figure is `make bench`'s own (0.6 KB requests, bench/results.md), "
        "which the lead reruns; this load's "
        f"~{pace['turn_tokens'] * 4 / 1000:.0f} KB requests compare only with the same load, features on "
        "against off, in the same run.",
    ]
    return "\n".join(lines) + "\n"


def summary(ctx: dict[str, Any], phases: dict[str, dict[str, Any]]) -> str:
    """bench/results.md's section: the verdicts of each side, the missed ones by name."""
    judged = [(name, cells) for name, target, cells in rows(ctx, phases) if target]
    sides = []
    for side, at in (("on", 0), ("off", 1)):
        missed = [name for name, cells in judged if cells[at].startswith("**MISSED**")]
        met = sum(cells[at].startswith("**met**") for _, cells in judged)
        sides.append(
            f"features {side}: {met} of {len(judged)} targets met"
            + (f" (missed: {'; '.join(missed)})" if missed else "")
        )
    return (
        f"{HEADING}\n\n`make bench-pool` on {ctx['date']}, commit {ctx['commit']}: {sides[0]}; {sides[1]}. "
        f"Every figure and its target: [bench/pool.md]({POOL_MD.name}).\n"
    )


def _section(results: str) -> tuple[int, int]:
    """Where the section is in bench/results.md's text, from its heading to the next heading or marker
    (`make bench-scale`'s begins with one); (-1, -1) when it is not there."""
    start = results.find(f"\n{HEADING}\n")
    if start < 0:
        return -1, -1
    ends = [at for at in (results.find("\n## ", start + 1), results.find("\n<!--", start + 1)) if at >= 0]
    return start, min(ends, default=len(results))


def kept(results_md: Path) -> list[str]:
    """The section as `results_md` holds it (none: []): what `make bench`'s rewrite carries over."""
    text = results_md.read_text() if results_md.exists() else ""
    start, end = _section(text)
    return [text[start:end].strip(), ""] if start >= 0 else []


def write(section: str, short: str) -> None:
    """bench/pool.md (`section`), and `short` as its section of bench/results.md (replaced, else added
    before `make bench-scale`'s section or the latency tables)."""
    POOL_MD.write_text(section)
    if not RESULTS_MD.exists():
        return
    results = RESULTS_MD.read_text()
    start, end = _section(results)
    if start < 0:  # before `make bench-scale`'s section, else before the latency tables, else at the end
        found = [at for at in (results.find("\n<!--"), results.find("\n## Added latency")) if at >= 0]
        start = end = min(found, default=len(results.rstrip()))
    tail = results[end:] or "\n"
    RESULTS_MD.write_text(results[:start] + "\n" + short.strip() + "\n" + tail)
