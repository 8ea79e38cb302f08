"""loadgen bench: the headline table, the tenants file, and whole benches on loopback servers."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from gateway.tenants import parse_tenants as parse_tenants_yaml
from loadgen.bench import ADMIN_KEY, KEYS, BenchConfig, run_bench, write_tenants_file
from loadgen.benchtable import (
    RunOutcome,
    format_bench_markdown,
    goal_lines,
    headline_table,
    latency_table,
)

TINY_WORKLOAD: dict[str, Any] = {
    "interactive": "synthetic-coding,max_requests=12,rate_scale=20,token_scale=0.05,"
                   "max_total_tokens=256",
    "batch": "concurrency=2,prompt=16,gen=8",
    # the interactive burst arrives within ~0.1 s; a slow or busy CPU can keep both devices on
    # it past a shorter tail, leaving no batch token inside the measurement window
    "tail_s": 2.0,
    "warmup_requests": 1,
}


def _summary(att: float, lp: float, total: float, n: int = 300) -> dict[str, object]:
    return {"hp_requests": n, "hp_slo_attainment": att, "hp_ttft_p50_s": 0.1,
            "hp_ttft_p90_s": 0.2, "hp_ttft_p99_s": 0.3, "hp_tpot_p50_s": 0.05, "hp_errors": 0,
            "lp_tok_s": lp,
            "total_tok_s": total, "errors": 0, "busy_fraction": 0.5}


def test_headline_table_ratios_and_failed_rows() -> None:
    outcomes = {
        "fcfs": RunOutcome("fcfs", _summary(0.8, 100.0, 200.0)),
        "slice": RunOutcome("slice", _summary(0.995, 150.0, 196.0)),
        "vllm": RunOutcome.failed("vllm", "exited with code 1 before it was ready:\nno CPU"),
    }
    table = headline_table(outcomes, ["fcfs", "slice", "vllm", "transformers"], alone_p90=0.1)
    assert len(table) == 6 and all(line.count("|") == 12 for line in table)
    assert ("| fcfs | 80.0% (300) | 100 / 200 / 300 | 2.00× | 100.0 | 1.00× | 200.0 | 1.00× "
            "| 50% | 0 |") in table[2]
    assert "| 150.0 | 1.50× | 196.0 | 0.98× |" in table[3]
    assert "| vllm | did not run: exited with code 1 before it was ready: no CPU |" in table[4]
    assert "| transformers | did not run: not requested (see --peers) |" in table[5]


def test_latency_table_against_vllm() -> None:
    fast = {**_summary(1.0, 0.0, 10.0), "hp_tpot_p50_s": 0.04}
    slow_tpot = {**_summary(1.0, 0.0, 10.0), "hp_tpot_p50_s": 0.06}
    outcomes = {"fcfs": RunOutcome("fcfs", fast), "slice": RunOutcome("slice", slow_tpot),
                "vllm": RunOutcome("vllm", _summary(1.0, 0.0, 10.0)),
                "static": RunOutcome.failed("static", "no")}
    table = latency_table(outcomes, ["fcfs", "slice", "static", "vllm"])
    assert table[2] == "| fcfs | 300 | 100 / 200 / 300 | 40.0 | yes |"
    assert table[3] == "| slice | 300 | 100 / 200 / 300 | 60.0 | no |"  # TPOT above vLLM's
    assert table[4] == "| vllm | 300 | 100 / 200 / 300 | 50.0 | – |" and len(table) == 5
    alone = latency_table({"fcfs": RunOutcome("fcfs", fast)}, ["fcfs", "vllm"])
    assert alone[2].endswith("| – |")  # no vLLM run: nothing to compare with


def test_goals_are_checked_where_their_runs_ran() -> None:
    outcomes = {
        "fcfs": RunOutcome("fcfs", _summary(0.8, 100.0, 200.0)),
        "slice": RunOutcome("slice", _summary(0.995, 94.0, 196.0)),
        "slice-alone": RunOutcome("slice-alone", _summary(0.955, 0.0, 20.0)),
    }
    lines = goal_lines(outcomes, "slice-alone", 0.18)
    assert lines[0].endswith("99.5% >= 99% over 300 requests; alone: 95.5%: met")
    assert lines[1].endswith("p90 <= 1.2x slice alone (1.11×): met")
    assert lines[2].endswith("total tok/s >= 0.97x fcfs (0.98×): met")
    assert lines[3].endswith("batch tok/s >= 0.95x fcfs (0.94×): MISSED")
    assert lines[4].endswith("not checked (a run it needs is missing)")
    assert goal_lines(outcomes, "static-alone", 0.18)[1].endswith("not checked (a run it "
                                                                   "needs is missing)")
    assert goal_lines({}) == ["- slice did not run: no goal can be checked."]


def test_an_interrupted_bench_says_which_runs_it_skipped() -> None:
    doc = {"started_at": "T0", "finished_at": "T1", "interrupted": True,
           "command": "python -m loadgen bench", "slo_s": 0.25, "slo_source": "given",
           "model_folder": "/m", "interactive_requests": 300, "mixed_duration_s": 10.0,
           "config": {"model": "default", "dtype": "bfloat16", "max_model_len": 2048,
                      "devices": None, "interactive": "synthetic-coding", "batch": "b"}}
    outcomes = {"fcfs": RunOutcome("fcfs", _summary(0.8, 100.0, 200.0),
                                   note="interrupted: partial run")}
    text = format_bench_markdown(doc, outcomes, ["fcfs", "slice"], ["transformers"])
    assert "T0 to T1 (interrupted): `python -m loadgen bench`" in text
    assert "| 0 | interrupted: partial run |" in text
    assert "| slice | did not run: the bench was interrupted before this run |" in text
    assert "| transformers | did not run: the bench was interrupted" in text
    assert "| vllm | did not run: not requested (see --peers) |" in text
    assert "Interactive TTFT SLO: 250 ms (given)." in text


def test_the_tenants_file_is_one_the_gateway_reads(tmp_path: Path) -> None:
    path = write_tenants_file(tmp_path / "tenants.yaml", 0.2504)
    tenants = parse_tenants_yaml(path.read_text())
    assert tenants.is_admin(ADMIN_KEY)
    text = path.read_text()
    assert "ttft_slo_ms: 250" in text and KEYS["batch"] in text
    assert "ttft_slo_ms" not in write_tenants_file(tmp_path / "none.yaml", None).read_text()


def test_config_errors() -> None:
    with pytest.raises(ValueError, match="include fcfs"):
        BenchConfig(out=Path("x"), policies=("slice",))
    BenchConfig(out=Path("x"), policies=("slice",), batch="none")  # alone: no ratios to fcfs
    with pytest.raises(ValueError, match="unknown peer 'tgi'"):
        BenchConfig(out=Path("x"), peers=("tgi",))
    with pytest.raises(ValueError, match="--slo-factor"):
        BenchConfig(out=Path("x"), slo_factor=0)
    with pytest.raises(ValueError, match="unknown recipe 'loose'"):
        BenchConfig(out=Path("x"), recipe="loose")


def test_bench_of_two_policies_on_the_stub_server(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    config = BenchConfig(
        out=out, policies=("fcfs", "static"), peers=("vllm",), model="tiny-random",
        serve_cmd=(sys.executable, "-m", "loadgen", "stub", "--step-ms", "2"),
        peers_dir=tmp_path / "no-peers", **TINY_WORKLOAD)
    doc = run_bench(config)
    assert doc["slo_s"] is not None and doc["slo_source"].startswith("p90 TTFT")
    assert doc["slo_s"] == doc["alone_hp_ttft_p90_s"]
    assert set(doc["runs"]) == {"static-alone", "fcfs", "static", "vllm"}
    for name in ("static-alone", "fcfs", "static"):
        run = doc["runs"][name]
        assert run["status"] == "ok", run
        assert (out / "runs" / name / "report.json").is_file()
        assert (out / "runs" / name / "ttft_cdf.png").is_file()
    assert doc["runs"]["fcfs"]["hp_requests"] == 12 and doc["runs"]["fcfs"]["lp_tok_s"] > 0
    assert doc["runs"]["static-alone"]["lp_tok_s"] == 0
    # the alone run is judged against the SLO it set: its p90, so about 90% within
    assert 0.8 <= doc["runs"]["static-alone"]["hp_slo_attainment"] <= 1.0
    assert "not found" in doc["runs"]["vllm"]["reason"]
    assert json.loads((out / "bench.json").read_text())["runs"]["fcfs"]["status"] == "ok"
    markdown = (out / "bench.md").read_text()
    assert "| fcfs |" in markdown and "| vllm | did not run: peer script" in markdown
    assert (out / "bench_ttft_cdf.png").is_file() and (out / "bench_idle_slices_cdf.png").is_file()
    tenants = (out / "runs" / "fcfs" / "tenants.yaml").read_text()
    assert f"ttft_slo_ms: {max(1, round(doc['slo_s'] * 1000))}" in tenants


def test_the_slo_can_come_from_slice_alone_with_a_margin(tmp_path: Path) -> None:
    config = BenchConfig(
        out=tmp_path / "bench", policies=("fcfs",), peers=(), model="tiny-random",
        serve_cmd=(sys.executable, "-m", "loadgen", "stub", "--step-ms", "2"),
        alone_policy="slice", slo_factor=1.2, **TINY_WORKLOAD)
    doc = run_bench(config)
    assert set(doc["runs"]) == {"slice-alone", "fcfs"}
    assert doc["slo_s"] == pytest.approx(1.2 * doc["alone_hp_ttft_p90_s"])
    assert doc["slo_source"] == "1.2 x p90 TTFT of interactive alone under slice"
    assert "| slice-alone |" in (tmp_path / "bench" / "bench.md").read_text()


def test_interactive_alone_on_the_stub_server(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    config = BenchConfig(
        out=out, policies=("slice",), peers=(), model="tiny-random", slo_ms=1000,
        serve_cmd=(sys.executable, "-m", "loadgen", "stub", "--step-ms", "2"),
        **{**TINY_WORKLOAD, "batch": "none"})
    doc = run_bench(config)
    run = doc["runs"]["slice"]
    assert run["status"] == "ok" and run["hp_requests"] == 12 and run["lp_tok_s"] == 0
    assert run["hp_tpot_p50_s"] is not None and run["hp_tpot_p50_s"] > 0
    report = json.loads((out / "runs" / "slice" / "report.json").read_text())
    assert set(report["tenants"]) == {"interactive"}
    markdown = (out / "bench.md").read_text()
    assert "## Interactive latency" in markdown and "| slice | 12 |" in markdown


def test_bench_of_two_policies_on_slicegate(tmp_path: Path) -> None:
    """The real `python -m gateway serve --model tiny-random`, once per policy.

    The SLO is given (the stub bench above measures one), so only two servers start.
    """
    config = BenchConfig(out=tmp_path / "bench", policies=("fcfs", "slice"), peers=(),
                         model="tiny-random", devices="cpu:0,cpu:1", dtype="float32",
                         max_model_len=512, ready_timeout_s=60, slo_ms=1000, **TINY_WORKLOAD)
    doc = run_bench(config)
    assert set(doc["runs"]) == {"fcfs", "slice"} and doc["slo_s"] == 1.0
    for name in ("fcfs", "slice"):
        run = doc["runs"][name]
        assert run["status"] == "ok", run
        assert run["hp_requests"] == 12 and run["errors"] == 0 and run["lp_tok_s"] > 0
        assert run["busy_fraction"] is not None and 0 < run["busy_fraction"] <= 1
        report = json.loads((tmp_path / "bench" / "runs" / name / "report.json").read_text())
        assert set(report["devices"]["per_device"]) == {"cpu:0", "cpu:1"}
        assert report["tenants"]["interactive"]["slo_s"] == 1.0
        assert report["tenants"]["batch"]["slo_s"] is None
    tenants = (tmp_path / "bench" / "runs" / "slice" / "tenants.yaml").read_text()
    assert "ttft_slo_ms: 1000" in tenants
