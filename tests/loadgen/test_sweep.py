"""`bench --sweep` (loadgen/sweep.py): settings parsed, each a run with its own flags."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from loadgen.bench import BenchConfig, run_bench
from loadgen.sweep import PRESETS, parse_sweep
from tests.loadgen.test_bench import TINY_WORKLOAD


def test_settings_and_the_granularity_preset_parse() -> None:
    assert parse_sweep("a=--layers-per-group 2; b=--layer-groups 2,10 --dtype float32") == (
        ("a", ("--layers-per-group", "2")), ("b", ("--layer-groups", "2,10", "--dtype", "float32")))
    preset = parse_sweep("granularity")
    assert [n for n, _ in preset] == ["lpg2", "lpg5", "lpg10", "lpg30", "adaptive-2-10"]
    assert preset[-1][1] == ("--layer-groups", "2,10") and "granularity" in PRESETS
    assert parse_sweep("chunks")[0] == ("mbt256", ("--max-num-batched-tokens", "256"))


@pytest.mark.parametrize("bad, problem", [
    ("", "empty sweep"), ("a", "NAME=FLAGS"), ("a=", "NAME=FLAGS"),
    ("a=--x 1;a=--x 2", "named twice"), ("../a=--x 1", "one word")])
def test_bad_settings_are_refused(bad: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_sweep(bad)


def test_a_sweep_name_may_not_take_another_run_s(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="must differ"):
        BenchConfig(out=tmp_path, policies=("slice",), peers=(), sweep=(("slice", ("-x",)),))


def test_each_setting_runs_with_its_flags_on_the_stub_server(tmp_path: Path) -> None:
    # the stub's decode step is its --step-ms: the later flag wins, so the runs differ
    out = tmp_path / "bench"
    config = BenchConfig.for_recipe(
        out, "saturating", policies=(), peers=(), model="tiny-random", slo_ms=5000.0,
        serve_cmd=(sys.executable, "-m", "loadgen", "stub", "--step-ms", "2"),
        sweep=parse_sweep("fast=--step-ms 1;slow=--step-ms 20"), **TINY_WORKLOAD)
    doc = run_bench(config)
    assert set(doc["runs"]) == {"slice-alone", "fast", "slow"}
    assert all(r["status"] == "ok" for r in doc["runs"].values()), doc["runs"]
    assert doc["runs"]["slow"]["hp_tpot_p50_s"] > 2 * doc["runs"]["fast"]["hp_tpot_p50_s"]
    markdown = (out / "bench.md").read_text()
    assert set(doc["saturating"]["runs"]) == {"slice-alone", "fast", "slow"}
    assert "| fast |" in markdown and "| slow | `--step-ms 20` |" in markdown
