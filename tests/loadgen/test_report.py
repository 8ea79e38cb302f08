"""loadgen.report, loadgen.stats, loadgen.timeline: report math on hand-made records."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from loadgen.client import CANCELLED, RequestRecord
from loadgen.probe import parse_tenant_slos
from loadgen.replay import ReplayResult
from loadgen.report import (
    build_report,
    fairness,
    format_markdown,
    jain_index,
    resolve_slos,
    slo_attainment,
    tokens_within,
    write_report,
)
from loadgen.stats import cdf, distribution, median_interval, percentile
from loadgen.timeline import (
    OpSpan,
    busy_intervals,
    busy_over_time,
    device_usage,
    merge,
    parse_timeline,
)
from loadgen.workload import TenantSpec, parse_source


def _record(tenant: str = "ide", send: float = 0.0, ttft: float | None = 0.1,
            tokens: int = 3, gap: float = 0.05, error: str | None = None,
            status: int = 200) -> RequestRecord:
    r = RequestRecord(tenant, 0, send, 10, tokens, status=status, error=error)
    if ttft is not None:
        r.first_token_s = send + ttft
        r.token_s = [send + ttft + i * gap for i in range(tokens)]
        r.output_tokens = tokens
        r.end_s = r.token_s[-1]
    else:
        r.end_s = send + 1.0
    return r


def test_percentiles_interpolate_linearly() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile(range(1, 101), 90) == pytest.approx(90.1)
    assert percentile([10, 0, 5], 0) == 0 and percentile([10, 0, 5], 100) == 10
    d = distribution([1.0, 2.0, 3.0, 4.0])
    assert (d.count, d.mean, d.p50, d.max) == (4, 2.5, 2.5, 4.0)
    assert distribution([]).to_json() == {
        "count": 0, "mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    assert cdf([3, 1, 2]) == ([1, 2, 3], [1 / 3, 2 / 3, 1.0])


def test_the_median_interval_covers_the_median_about_95_times_in_100() -> None:
    assert median_interval([]) is None and median_interval([1.0]) is None
    assert median_interval(range(40)) == (12, 27)  # ranks 13 and 28 of 40
    assert median_interval([5.0, 1.0, 3.0]) == (1.0, 5.0)  # clipped to the sample
    rng = random.Random(0)
    covered = 0
    for _ in range(400):
        interval = median_interval([rng.gauss(0.0, 1.0) for _ in range(60)])
        assert interval is not None
        covered += interval[0] <= 0.0 <= interval[1]
    assert 0.92 <= covered / 400 <= 0.99


def test_slo_attainment_judges_failures_and_long_waits() -> None:
    records = [
        _record(ttft=0.1), _record(ttft=0.2), _record(ttft=0.6),  # met, met, missed
        _record(ttft=None, error="boom", status=500),  # failed: missed
        _record(ttft=None, error=CANCELLED, status=0),  # waited 1.0 s > SLO: missed
    ]
    assert slo_attainment(records, 0.5) == (2 / 5, 5)
    short = _record(ttft=None, error=CANCELLED, status=0)
    short.end_s = 0.2  # cancelled before the SLO ran out: not judged
    assert slo_attainment([*records, short], 0.5) == (2 / 5, 5)
    assert slo_attainment([short], 0.5) == (None, 0)
    assert slo_attainment(records[:2], 0.2) == (1.0, 2)  # <= counts as met


def test_tokens_within_the_window() -> None:
    r = _record(ttft=0.1, tokens=4, gap=1.0)  # tokens at 0.1, 1.1, 2.1, 3.1
    assert tokens_within(r, 10.0) == 4 and tokens_within(r, 2.5) == 3
    r.output_tokens = 8  # usage counted more tokens than chunks (several per chunk)
    assert tokens_within(r, 10.0) == 8


def test_timeline_union_idle_slices_and_busy_fraction() -> None:
    spans = [
        OpSpan("cpu:0", 1.0, 2.0), OpSpan("cpu:0", 1.5, 2.5),  # overlap -> [1, 2.5]
        OpSpan("cpu:0", 3.0, 3.5), OpSpan("cpu:0", 3.5, 4.0),  # touching -> [3, 4]
        OpSpan("cpu:0", 4.1, 9.0),  # clipped to the window end 6
        OpSpan("cpu:1", 0.0, 0.5), OpSpan("cpu:1", 5.0, 5.5),  # starts before the window
    ]
    assert busy_intervals(spans[:5], 0.5, 6.0) == [(1.0, 2.5), (3.0, 4.0), (4.1, 6.0)]
    usage = {u.device: u for u in device_usage(spans, 0.5, 6.0)}
    cpu0, cpu1 = usage["cpu:0"], usage["cpu:1"]
    assert cpu0.busy_s == pytest.approx(1.5 + 1.0 + 1.9)
    assert cpu0.busy_fraction == pytest.approx(4.4 / 5.5)
    assert cpu0.idle_slices_s == pytest.approx((0.5, 0.1)) and cpu0.num_ops == 5
    assert cpu1.busy_fraction == pytest.approx(0.5 / 5.5) and cpu1.idle_slices_s == ()
    assert cpu0.idle_distribution().p50 == pytest.approx(0.3)
    bins = busy_over_time(spans, 0.0, 6.0, 2.0)
    assert bins["cpu:0"] == pytest.approx([0.5, 0.75, 0.95])
    assert bins["cpu:1"] == pytest.approx([0.25, 0.0, 0.25])


def test_parse_timeline_formats_and_merge() -> None:
    event = {"device": "cpu:0", "op": "layers.0", "class": "high", "start": 1, "end": 2}
    assert parse_timeline([event]) == [OpSpan("cpu:0", 1.0, 2.0, "layers.0", "high")]
    assert parse_timeline({"now": 5.0, "events": [event, event]})[1].request_class == "high"
    assert parse_timeline([{**event, "cpu": 0.25}])[0].cpu_s == 0.25
    assert parse_timeline([{**event, "cpu": None}])[0].cpu_s is None
    with pytest.raises(ValueError, match="numeric start/end"):
        parse_timeline([{"device": "cpu:0"}])
    with pytest.raises(ValueError, match="unexpected /admin/timeline body"):
        parse_timeline({"detail": "nope"})
    a, b = OpSpan("cpu:1", 0.0, 1.0), OpSpan("cpu:0", 2.0, 3.0)
    assert merge([a, b, a]) == [b, a]


def test_tenant_slos_from_metrics() -> None:
    text = ('# HELP slicegate_tenant_ttft_slo_seconds SLO\n'
            'slicegate_tenant_ttft_slo_seconds{tenant="ide"} 0.5\n'
            'slicegate_tenant_ttft_slo_seconds{priority="high",tenant="chat"} 2\n'
            'vllm:num_requests_running{tenant="ide"} 3\n')
    assert parse_tenant_slos(text) == {"ide": 0.5, "chat": 2.0}


def _result(spans: list[OpSpan] | None = None) -> ReplayResult:
    tenants = (
        TenantSpec("ide", "k1", parse_source("rate=1,prompt=10,gen=3"), priority=0),
        TenantSpec("batch", "k2", parse_source("concurrency=2,prompt=10,gen=3"), slo_s=2.0),
        TenantSpec("chat", "k3", parse_source("rate=1,prompt=10,gen=3")),
    )
    records = [_record("ide", 0.0, 0.1), _record("ide", 1.0, 0.9),
               _record("ide", 2.0, None, error="overloaded", status=429),
               _record("batch", 0.0, 0.5, tokens=10), _record("chat", 0.5, 0.2)]
    return ReplayResult("http://x", "m", tenants, origin=100.0, window_s=4.0, end_s=4.0,
                        records=records, spans=spans or [], timeline_error="no admin key given",
                        server_slos={"ide": 0.5, "batch": 9.0})


def test_slos_come_from_the_spec_the_flag_or_the_server() -> None:
    result = _result()
    assert resolve_slos(result) == {"ide": (0.5, "server"), "batch": (2.0, "tenant spec"),
                                    "chat": (None, "none")}
    assert resolve_slos(result, 1.0)["ide"] == (1.0, "given")
    assert resolve_slos(result, 1.0)["batch"] == (2.0, "tenant spec")


def test_report_fields_and_markdown(tmp_path: Path) -> None:
    spans = [OpSpan("cpu:0", 100.5, 101.0), OpSpan("cpu:0", 101.5, 103.5)]
    report = build_report(_result(spans))
    ide = report["tenants"]["ide"]
    assert (ide["num_requests"], ide["num_ok"], ide["num_errors"]) == (3, 2, 1)
    assert ide["errors_by_status"] == {"429": 1}
    assert ide["ttft_s"]["p50"] == pytest.approx(0.5) and ide["ttft_s"]["count"] == 2
    assert (ide["slo_s"], ide["slo_source"]) == (0.5, "server")
    assert ide["slo_attainment"] == pytest.approx(1 / 3) and ide["num_slo_judged"] == 3
    assert ide["tpot_s"]["p50"] == pytest.approx(0.05)
    assert ide["output_tok_s"] == pytest.approx(6 / 4.0) and ide["req_s"] == pytest.approx(0.5)
    assert report["tenants"]["chat"]["slo_attainment"] is None
    assert report["total"]["output_tokens"] == 3 + 3 + 10 + 3
    devices = report["devices"]
    assert devices["available"] and devices["per_device"]["cpu:0"]["busy_fraction"] == 0.625
    assert devices["per_device"]["cpu:0"]["idle_slices_s"]["count"] == 1
    markdown = format_markdown(report)
    assert "| ide | 3 | 1 | 500 / 820 / 892 | 500 (server) | 33.3% | 50 | 1.5 | 0.50 |" in markdown
    assert "| cpu:0 | 62.5% | 2 | 1 | 500 / 500 / 500 |" in markdown
    assert "errors {'429': 1}" in markdown
    write_report(_result(), tmp_path)
    assert json.loads((tmp_path / "report.json").read_text())["devices"] == {
        "available": False, "reason": "no admin key given"}
    lines = (tmp_path / "requests.jsonl").read_text().splitlines()
    assert len(lines) == 5 and json.loads(lines[0])["tenant"] == "ide"
    assert "Device use: not available (no admin key given)." in (tmp_path / "report.md").read_text()


def test_no_op_in_the_window_is_reported() -> None:
    report = build_report(_result([OpSpan("cpu:0", 1.0, 2.0)]))
    assert report["devices"] == {"available": False,
                                 "reason": "no timeline op falls in the replay window"}


def test_jain_index_and_fairness_groups() -> None:
    assert jain_index([]) is None and jain_index([0.0, 0.0]) == 1.0
    assert jain_index([3.0, 1.0]) == pytest.approx(16 / 20)
    tenants = {"a": {"slo_s": 0.5, "output_tok_s": 10.0}, "b": {"slo_s": 0.5, "output_tok_s": 10.0},
               "c": {"slo_s": None, "output_tok_s": 5.0}}
    assert fairness(tenants) == {"interactive": 1.0}
