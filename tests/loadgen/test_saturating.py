"""The saturating recipe's figures and goals, and a short run of it on slicegate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.tenants import parse_tenants as parse_tenants_yaml
from loadgen.bench import BenchConfig, run_bench, write_tenants_file
from loadgen.benchtable import RunOutcome
from loadgen.saturating import saturating_lines, saturating_summary


def _summary(att: float, tpot: float, lp: float, total: float) -> dict[str, Any]:
    return {"hp_requests": 279, "hp_slo_attainment": att, "hp_ttft_p50_s": 0.188,
            "hp_ttft_p90_s": 0.434, "hp_ttft_p99_s": 0.692, "hp_tpot_p50_s": tpot,
            "lp_tok_s": lp, "total_tok_s": total}


def test_ratios_to_vllm_and_the_goals() -> None:
    outcomes = {"slice-alone": RunOutcome("slice-alone", _summary(1.0, 0.030, 0.0, 25.0)),
                "slice": RunOutcome("slice", _summary(0.995, 0.058, 86.3, 111.0)),
                "vllm": RunOutcome("vllm", _summary(0.336, 0.070, 66.4, 90.9))}
    summary = saturating_summary(outcomes, ["slice-alone", "slice", "vllm"], "slice-alone")
    sl = summary["runs"]["slice"]
    assert sl["tpot_x_alone"] == pytest.approx(0.058 / 0.030)
    assert sl["total_x_vllm"] == pytest.approx(111.0 / 90.9)
    assert sl["batch_x_vllm"] == pytest.approx(86.3 / 66.4)
    assert summary["runs"]["vllm"]["total_x_vllm"] is None  # no ratio to itself
    assert summary["runs"]["vllm"]["hp_tpot_alone_p50_s"] is None  # slicegate's alone run
    assert summary["goals"] == {"interactive_slo_attainment": True,
                                "tpot_under_load_x_alone": True, "total_x_vllm": True,
                                "batch_x_vllm": True}
    lines = saturating_lines(summary, 0.5)
    assert "Interactive TTFT SLO 500 ms" in lines[2]
    assert ("| slice | 99.5% (279) | 188 / 434 / 692 | 58.0 | 30.0 | 1.93× | 86.3 | 1.30× "
            "| 111.0 | 1.22× |") in lines
    assert "- slice: batch tok/s 1.30× vLLM's >= 1.25×: met" in lines


def test_goals_are_missed_or_not_checked() -> None:
    outcomes = {"slice": RunOutcome("slice", _summary(0.96, 0.07, 60.0, 80.0)),
                "vllm": RunOutcome("vllm", _summary(0.3, 0.07, 66.4, 90.9)),
                "slice-alone": RunOutcome.failed("slice-alone", "exited")}
    summary = saturating_summary(outcomes, ["slice-alone", "slice", "vllm"], "slice-alone")
    assert set(summary["runs"]) == {"slice", "vllm"}
    assert summary["goals"] == {"interactive_slo_attainment": False,
                                "tpot_under_load_x_alone": None, "total_x_vllm": False,
                                "batch_x_vllm": False}
    text = "\n".join(saturating_lines(summary, 0.5))
    assert "under load – alone <= 2×: not checked" in text
    assert "within the SLO 96.0% >= 99%: MISSED" in text
    empty = saturating_summary({}, ["slice"], None)
    assert empty["runs"] == {} and set(empty["goals"].values()) == {None}


def test_the_tenants_file_carries_a_tpot_slo_and_default_models(tmp_path: Path) -> None:
    text = write_tenants_file(tmp_path / "t.yaml", 0.5, 0.0604).read_text()
    assert "ttft_slo_ms: 500" in text and "tpot_slo_ms: 60" in text
    path = write_tenants_file(tmp_path / "m.yaml", 0.5,
                              models={"interactive": "chat", "batch": "batch"})
    assert "tpot_slo_ms" not in path.read_text()  # only when asked: older servers refuse it
    tenants = parse_tenants_yaml(path.read_text())
    assert tenants.tenant_named("interactive").default_model == "chat"  # type: ignore[union-attr]
    assert tenants.tenant_named("batch").default_model == "batch"  # type: ignore[union-attr]


def test_a_short_saturating_run_on_slicegate(tmp_path: Path) -> None:
    """The real `python -m gateway serve --model tiny-random`: the stream alone, then the mix,
    both under slice and the recipe's fixed 500 ms SLO; no peer."""
    out = tmp_path / "bench"
    config = BenchConfig.for_recipe(
        out, "saturating", peers=(), model="tiny-random", devices="cpu:0,cpu:1",
        dtype="float32", max_model_len=512, ready_timeout_s=60.0, warmup_requests=1,
        interactive="synthetic-coding,max_requests=12,rate_scale=20,token_scale=0.05,"
                    "max_total_tokens=256",
        batch="concurrency=2,prompt=16,gen=8")
    doc = run_bench(config)
    assert set(doc["runs"]) == {"slice-alone", "slice"}
    assert doc["slo_s"] == 0.5 and doc["slo_source"] == "the saturating recipe's"
    assert all(run["status"] == "ok" for run in doc["runs"].values()), doc["runs"]
    sl = doc["saturating"]["runs"]["slice"]
    assert sl["hp_requests"] == 12 and sl["lp_tok_s"] > 0
    assert sl["hp_tpot_alone_p50_s"] == doc["runs"]["slice-alone"]["hp_tpot_p50_s"] > 0
    assert sl["tpot_x_alone"] is not None and sl["total_x_vllm"] is None
    assert doc["saturating"]["goals"]["total_x_vllm"] is None
    assert json.loads((out / "bench.json").read_text())["saturating"] == doc["saturating"]
    markdown = (out / "bench.md").read_text()
    assert "## Saturating mix" in markdown and "| slice | " in markdown
    assert "ttft_slo_ms: 500" in (out / "runs" / "slice-alone" / "tenants.yaml").read_text()
    assert (out / "runs" / "slice" / "data").is_dir()  # its own data dir: no other's lock
