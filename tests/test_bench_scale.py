"""`make bench-scale`'s own parts: its verdicts and where its section goes (pure), its bulk ledger and the
admin probe on a real database, and its paced stream upstream and client over real sockets."""

import asyncio

import pytest
from django.db import connection
from django.db.models import Sum

from bench.scale import figures, report, seed
from bench.scale.streams import run_streams, summary
from devkit.harness import HOST, PYTHON, Processes, free_port
from proxy.ledger.models import Attempt, DailySpend, RequestRecord
from tests.factories import AssignmentFactory, CatalogEntryFactory, PoolFactory


def wrk(p50: float, cpu: float, db: float) -> dict:
    return {"p50_ms": p50, "cpu_ms_per_req": cpu, "db_cpu_ms_per_req": db, "rps": 1000.0}


def keys_raw(big_cpu: float) -> dict:
    return {
        "sizes": [10, 100_000],
        "load": {
            "c1": {"direct": wrk(0.1, 0, 0), "keys-10": wrk(1.1, 0, 0), "keys-100000": wrk(1.14, 0, 0)},
            "c16": {"keys-10": wrk(5, 0.8, 0.2), "keys-100000": wrk(5, big_cpu, 0.2)},
        },
    }


def test_the_keys_target_compares_the_largest_size_with_the_smallest_within_5_percent():
    met = figures.keys_curve(keys_raw(big_cpu=0.84))  # 1.04 ms against 1.00 ms
    assert [v[2] for v in met.verdicts] == [True, True]  # added p50 1.04 against 1.00 ms: +4 %
    missed = figures.keys_curve(keys_raw(big_cpu=0.86))  # 1.06 ms: +6 %
    assert [v[2] for v in missed.verdicts] == [True, False]
    assert "+6.0 %" in missed.verdicts[1][3]
    assert missed.rows[1][1] == ["1.000", "1.060 (+6.0 %)"]  # each size beside the smallest


def test_a_page_at_the_largest_history_is_judged_against_500_ms_and_a_missing_figure_is_not_met():
    probes = {
        "0": {"request_list": {"ms": 40, "queries": 10}, "spend": {"ms": 10, "queries": 4}},
        "10000000": {"request_list": {"ms": 499, "queries": 10}, "spend": {"ms": 900, "queries": 4}},
    }
    curve = figures.history_curve({"sizes": [0, 10_000_000], "load": {}, "probes": probes})
    pages = {v[0]: v[2] for v in curve.verdicts if "records" in v[0] and "latency" not in v[0]}
    assert pages["request list at 10,000,000 records"] is True
    assert pages["spend page at 10,000,000 records"] is False
    assert pages["a request's page at 10,000,000 records"] is None  # not measured: neither met nor missed


def test_stream_cpu_per_event_is_flat_unless_a_size_costs_more_than_20_percent_above_the_smallest():
    def level(cpu: float, cut: int = 0) -> dict:
        side = {"cpu_us_per_event": cpu, "cut": cut, "stalled": 0, "latency_p50_ms": 1.0}
        return {"gateway": side, "direct": {"latency_p50_ms": 0.5}}

    raw = {"sizes": [1, 100, 1000], "levels": {"1": level(20.0), "100": level(9.0), "1000": level(23.0)}}
    assert figures.streams_curve(raw).verdicts[0][2] is True  # cheaper in batches, +15 % at most: flat
    raw["levels"]["1000"] = level(25.0, cut=1)
    flat, whole = figures.streams_curve(raw).verdicts[:2]
    assert (flat[2], whole[2]) == (False, False)


def test_the_section_replaces_its_own_markers_and_nothing_else():
    first = report.place(
        "# Benchmark results\n\n## Added latency\n\nrows\n", f"{report.BEGIN}\nA\n{report.END}\n"
    )
    assert first.index(report.BEGIN) < first.index("## Added latency")
    again = report.place(first + "\n## Later\n", f"{report.BEGIN}\nB\n{report.END}\n")
    assert "\nA\n" not in again and "\nB\n" in again
    assert again.count(report.BEGIN) == 1 and again.endswith("## Later\n")


def test_make_bench_keeps_the_section_as_it_was(tmp_path):
    results = tmp_path / "results.md"
    assert report.kept(results) == []
    section = f"{report.BEGIN}\n## Scale\nrows\n{report.END}"
    results.write_text(f"# Benchmark results\n\nold run\n{section}\n\n## Added latency\n")
    assert report.kept(results) == [section, ""]


def test_every_curve_goes_whole_to_scale_md_and_one_row_each_to_results_md(tmp_path, monkeypatch):
    """bench/scale.md holds each curve's table and verdicts; bench/results.md, between its markers, one
    row per curve: its headline figure at the smallest and the largest size, its targets met, the
    missed ones by name, a link to the curve's section."""
    results_md, scale_md = tmp_path / "results.md", tmp_path / "scale.md"
    results_md.write_text(f"# Benchmark results\n\n{report.BEGIN}\nold\n{report.END}\n\n## Added latency\n")
    monkeypatch.setattr(report, "RESULTS_MD", results_md)
    monkeypatch.setattr(report, "SCALE_MD", scale_md)
    monkeypatch.setattr(report, "PLOTS", tmp_path / "plots")
    history = {
        "sizes": [0, 10_000_000],
        "load": {},
        "probes": {
            "0": {"spend": {"ms": 39, "queries": 4}},
            "10000000": {"spend": {"ms": 900, "queries": 4}},
        },
    }
    context = {
        "date": "2026-12-05 19:00 UTC",
        "commit": "abc1234",
        "machine": "2 CPUs",
        "load_start": [0, 0, 0],
    }
    raw = {"context": context, "curves": {"keys": keys_raw(big_cpu=0.86), "history": history}}
    assert report.write(raw, False, tmp_path) == scale_md
    whole = scale_md.read_text()
    assert "### Keys" in whole and "### History" in whole and "| keys | 10 keys | 100,000 keys |" in whole
    assert "| spend page at 10,000,000 records | under 500 ms | **MISSED**: 900 ms |" in whole
    text = results_md.read_text()
    section = text[text.index(report.BEGIN) : text.index(report.END)]
    assert "old" not in section and "### Keys" not in section and text.endswith("## Added latency\n")
    keys_row, history_row = (line for line in section.splitlines() if line.startswith("| ["))
    assert keys_row.startswith("| [Keys](scale.md#keys) | CPU per request, c=16: gateway + PostgreSQL (ms) |")
    assert "| 1.000 at 10 keys | 1.060 (+6.0 %) at 100,000 keys | 1 of 2 |" in keys_row
    assert "CPU per request at 100,000 keys: +6.0 %" in keys_row
    assert "| 39; 4 at 0 records | 900 (+2207.7 %); 4 at 10,000,000 records | 0 of 6 |" in history_row
    assert "spend page at 10,000,000 records: 900 ms" in history_row


@pytest.mark.django_db
@pytest.mark.skipif(connection.vendor != "postgresql", reason="the bulk ledger is PostgreSQL's SQL")
def test_the_bulk_ledger_spreads_its_records_over_the_days_and_the_probe_times_each_page():
    pool = PoolFactory(name="scale")
    for name in ("acct-a", "acct-b"):
        CatalogEntryFactory(assignment=AssignmentFactory(pool=pool, name=name), model="gpt-5")
    seed.seed_keys(20, "scale")
    seed.seed_ledger(2000, days=2, log=lambda _: None, vacuum=False)
    assert RequestRecord.objects.count() == 2000
    assert Attempt.objects.count() == 2100  # one in twenty handed off to a second attempt
    first, last = (
        RequestRecord.objects.order_by(f).values_list("started_at", flat=True)[0]
        for f in ("started_at", "-started_at")
    )
    assert 1.9 * 86400 < (last - first).total_seconds() <= 2 * 86400
    assert RequestRecord.objects.values("key").distinct().count() == 20
    # The spend page's daily totals, built from the bulk ledger as the ledger writer would have kept them.
    assert DailySpend.objects.aggregate(n=Sum("attempts"))["n"] == 2100
    cost = Sum("cost_micros")
    assert DailySpend.objects.aggregate(c=cost)["c"] == Attempt.objects.aggregate(c=cost)["c"] > 0

    from bench.scale.probe import probe_admin

    found = probe_admin(repeat=1, prune_days=1)
    for page in ("request_list", "request_page", "spend", "upstreams"):
        assert found[page]["queries"] > 0, page
    deleted = int(found["prune"]["said"].split()[1])  # "deleted N request records started before ..."
    assert 1000 <= deleted <= 1002  # the older of the two days (prune's now is a moment after the seed's)


def test_the_paced_upstream_streams_every_event_and_the_client_times_each(tmp_path):
    procs = Processes(tmp_path)
    port = free_port()
    procs.start(
        "upstream", [PYTHON, "-m", "bench.scale.stream_upstream", "--port", str(port), "--interval-ms", "10"]
    )
    try:

        async def streams():
            for _ in range(100):
                try:
                    _, writer = await asyncio.open_connection(HOST, port)
                    writer.close()
                    break
                except OSError:
                    await asyncio.sleep(0.05)
            return await run_streams(f"http://{HOST}:{port}/v1", "k", "gpt-5", 5, 30, (0, 600))

        found = summary(*asyncio.run(streams()), 30, stall_s=60)
    finally:
        procs.stop_all()
    assert (found["streams"], found["events_seen"], found["cut"], found["stalled"]) == (5, 150, 0, 0)
    assert found["events_in_window"] == found["latency_samples"] == 150  # each event's stamp read back
