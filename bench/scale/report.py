"""`make bench-scale`'s report: bench/scale.md, per curve a table (each size's figure beside the smallest
size's), the verdicts against issue 49's targets and a plot (bench/scale/plots/*.png, matplotlib), then
the profiles of the missed targets (bench/scale/profile.md); and its summary in bench/results.md, one
row per curve (its headline figure at the smallest and the largest size, its targets met, the missed
ones by name), linking each to its section of bench/scale.md. bench/results.md stays short enough to
read (issue 46: under 200 lines); the curves are read where they are whole.

The summary sits between BEGIN and END in bench/results.md: this replaces what is between them (or adds
them before the latency tables), and `make bench`'s rewrite of the file carries them over as they are.
A `--quick` run writes the whole report to bench/out/scale/section.md (and its plots beside it) instead:
a smoke run's figures are not the targets' sizes.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import Any

from bench.scale import figures
from bench.scale.figures import Curve, fmt
from bench.targets import RESULTS_MD, SCALE_MD, git_commit

PLOTS = Path(__file__).resolve().parent / "plots"
PROFILE = Path(__file__).resolve().parent / "profile.md"  # kept by hand: why each missed target is missed
BEGIN, END = "<!-- bench-scale:begin -->", "<!-- bench-scale:end -->"
HEADING = "## Scale (make bench-scale)"


def context(root: Path, quick: bool, sizes: dict[str, Any], pinned: bool) -> dict[str, Any]:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": git_commit(root),
        "machine": f"{os.cpu_count()} CPUs ({cpu}), Linux {platform.release()}, "
        f"Python {platform.python_version()}",
        "load_start": os.getloadavg(),
        "quick": quick,
        "sizes": sizes,
        "pinned": pinned,
    }


def curves(results: dict[str, Any]) -> list[Curve]:
    build = {
        "keys": figures.keys_curve,
        "accounts": figures.accounts_curve,
        "history": figures.history_curve,
        "streams": figures.streams_curve,
    }
    return [build[name](raw) for name, raw in results["curves"].items() if name in build]


def table(curve: Curve) -> list[str]:
    lines = [f"| {curve.title.lower()} | " + " | ".join(curve.sizes) + " |"]
    lines.append("|---" * (len(curve.sizes) + 1) + "|")
    lines += [f"| {label} | " + " | ".join(cells) + " |" for label, cells in curve.rows]
    lines += ["", "| target | limit | measured |", "|---|---|---|"]
    for what, limit, met, said in curve.verdicts:
        word = "not measured" if met is None else ("**met**" if met else "**MISSED**")
        lines.append(f"| {what} | {limit} | {word}: {said} |")
    return lines


def plot(curve: Curve, where: Path) -> str | None:
    """The curve's PNG (`where`/NAME.png); its path relative to bench/, or None without matplotlib
    (the bench extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    where.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(5.2, 2.8), dpi=100)
    for label, values in curve.plot.items():
        points = [(x, y) for x, y in zip(curve.x, values, strict=True) if y is not None]
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", label=label)
    if curve.limit is not None:
        ax.axhline(curve.limit, color="grey", linestyle="--", linewidth=1, label=f"limit {curve.limit:g}")
    ax.set_xscale("log")
    ax.set_xticks(curve.x, curve.ticks or curve.sizes, fontsize=7)
    ax.minorticks_off()
    ax.set_xlabel(curve.title.lower(), fontsize=8)
    ax.set_ylabel(curve.y_label)
    if curve.log_y:
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)
    ax.set_title(curve.title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = where / f"{curve.name}.png"
    fig.savefig(path)
    plt.close(fig)
    return os.path.relpath(path, SCALE_MD.parent)


def workers_lines(raw: dict[str, Any]) -> list[str]:
    found = figures.workers_figures(raw)
    labels = {
        "workers-1": "1 worker",
        "workers-2": "2 workers",
        "workers-1-limits": "1 worker, key with rpm/tpm/concurrent limits counted in the database",
    }
    lines = [
        "| gateway (both CPUs, beside wrk and the upstream) | req/s c=16 | req/s c=64 "
        "| CPU per request, c=64: gateway + PostgreSQL (ms) | requests per gateway CPU-second "
        "| requests per PostgreSQL CPU-second |",
        "|---|---|---|---|---|---|",
    ]
    for name, f in found.items():
        lines.append(
            f"| {labels[name]} | {fmt(f['rps_c16'], 0)} | {fmt(f['rps_c64'], 0)} "
            f"| {fmt(f['cpu_gateway'], 3)} + {fmt(f['cpu_db'], 3)} "
            f"| {fmt(f['per_gateway_core'], 0)} | {fmt(f['per_db_core'], 0)} |"
        )
    p = figures.paper(found)
    if p:
        lines += [
            "",
            "On paper, from these figures (upper bounds: every core busy, CPU per request as measured with "
            f"2 workers): a 16-core gateway node answers about {fmt(p['node_rps'], 0)} requests/s; 4 such "
            f"nodes {fmt(p['fleet_rps'], 0)}/s, which need about {fmt(p['db_cores_for_fleet'], 1)} "
            "PostgreSQL cores for the request path's read and the ledger's writes; one 16-core PostgreSQL "
            f"serves about {fmt(p['nodes_per_db'], 1)} such nodes.",
        ]
        if "limits_db_ms" in p:
            lines[-1] += (
                f" A key with limits counted in the database adds {fmt(p['limits_db_ms'], 3)} ms of "
                "PostgreSQL CPU per request (its minute's counters and its concurrency slot), leaving "
                f"{fmt(p['nodes_per_db_with_db_limits'], 1)} nodes per database: with `REDIS_URL` those "
                "counters move to Redis, which is where Redis is needed: many nodes, or one key's minute row "
                "updated by every node at once."
            )
    return lines


def render(results: dict[str, Any], quick: bool, plots: Path | None = None) -> str:
    """The whole report (bench/scale.md); with `plots`, each curve's plot drawn there and shown."""
    c = results["context"]
    load_end = c.get("load_end")
    lines = [
        HEADING,
        "",
        f"Written by `make bench-scale` (bench/scale/run.py) on {c['date']}, commit {c['commit']}, in "
        f"{c.get('elapsed_s', '?')} s; {c['machine']}; load average "
        + " ".join(f"{x:.2f}" for x in c["load_start"])
        + " at start"
        + ("" if not load_end else ", " + " ".join(f"{x:.2f}" for x in load_end) + " at end")
        + ". "
        + ("A `--quick` smoke run: small sizes, short runs, not the targets' sizes. " if quick else "")
        + (
            "Gateways on CPU 0, wrk, the upstream and the driver on CPU 1, PostgreSQL not moved. "
            if c.get("pinned")
            else ""
        )
        + "Each size is a gateway (one uvicorn worker) on a database of its own, filled in bulk before it "
        "starts; the sizes' wrk repetitions are interleaved (bench/README.md, `make bench-scale`).",
        "",
    ]
    for curve in curves(results):
        picture = plot(curve, plots) if plots is not None else None
        lines += [f"### {curve.title}", ""]
        if picture:
            lines += [f"![{curve.title}: the figure at each size]({picture})", ""]
        lines += [*table(curve), ""]
    if "workers" in results["curves"]:
        lines += ["### Workers", "", *workers_lines(results["curves"]["workers"]), ""]
    if PROFILE.exists():
        lines += [PROFILE.read_text().strip()]
    return "\n".join(lines).rstrip() + "\n"


def anchor(title: str) -> str:
    """The fragment GitHub gives a heading: lower case, spaces as hyphens, punctuation dropped."""
    return "".join(ch for ch in title.lower().replace(" ", "-") if ch.isalnum() or ch in "-_")


def summary(results: dict[str, Any]) -> str:
    """bench/results.md's section: one row per curve, linked to its section of bench/scale.md."""
    lines = [
        BEGIN,
        HEADING,
        "",
        "| curve (whole: bench/scale.md) | figure | smallest size | largest size | targets met | missed |",
        "|---|---|---|---|---|---|",
    ]
    for curve in curves(results):
        cells = dict(curve.rows).get(curve.headline, ["n/a"])
        met = sum(v[2] is True for v in curve.verdicts)
        missed = "; ".join(f"{what}: {said}" for what, _, ok, said in curve.verdicts if ok is False) or "none"
        lines.append(
            f"| [{curve.title}]({SCALE_MD.name}#{anchor(curve.title)}) | {curve.headline} "
            f"| {cells[0]} at {curve.sizes[0]} | {cells[-1]} at {curve.sizes[-1]} "
            f"| {met} of {len(curve.verdicts)} | {missed} |"
        )
    lines.append(END)
    return "\n".join(lines) + "\n"


def place(results_md: str, section: str) -> str:
    """results.md with `section` between the markers (replacing what was there), else inserted before
    the latency tables, else at the end."""
    start, end = results_md.find(BEGIN), results_md.find(END)
    if start >= 0 and end > start:
        return results_md[:start] + section.strip() + results_md[end + len(END) :]
    at = results_md.find("\n## Added latency")
    if at < 0:
        return results_md.rstrip() + "\n\n" + section
    return results_md[:at] + "\n" + section + results_md[at:]


def kept(results_md: Path) -> list[str]:
    """The section as `results_md` holds it, markers included (none: []): what `make bench`'s rewrite of
    the file carries over (bench/report.py)."""
    text = results_md.read_text() if results_md.exists() else ""
    start, end = text.find(BEGIN), text.find(END)
    return [text[start : end + len(END)], ""] if start >= 0 and end > start else []


def write(results: dict[str, Any], quick: bool, out: Path) -> Path:
    """Where the report went: bench/scale.md (its summary in bench/results.md), or `out`/section.md for a
    quick run."""
    if quick:
        (out / "section.md").write_text(render(results, quick, out / "plots"))
        return out / "section.md"
    SCALE_MD.write_text(render(results, quick, PLOTS))
    text = RESULTS_MD.read_text() if RESULTS_MD.exists() else "# Benchmark results\n"
    RESULTS_MD.write_text(place(text, summary(results)))
    return SCALE_MD
