"""Bench recipes: the saturating recipe's window, its defaults, and short runs of it."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest

from loadgen import public_traces
from loadgen.bench import BenchConfig
from loadgen.public_traces import TRACES_ENV
from loadgen.recipes import (
    RECIPES,
    SATURATING_BATCH,
    default_interactive,
    recipe_defaults,
    shortened,
)
from loadgen.workload import parse_source, plan_arrivals


@pytest.fixture
def azure_every_second(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An Azure code trace of one request a second for an hour, prompts of 32000 tokens."""
    folder = tmp_path / "traces"
    folder.mkdir()
    start = datetime(2024, 1, 1)
    rows = [f"{(start + timedelta(seconds=i)).isoformat(sep=' ')}.0000000,32000,50"
            for i in range(3600)]
    path = folder / "AzureLLMInferenceTrace_code.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    monkeypatch.setenv(TRACES_ENV, str(folder))
    monkeypatch.setattr(public_traces, "_BESIDE_REPO", tmp_path / "nothing")
    return path


def test_the_saturating_window_is_a_minute_at_a_quarter_speed(azure_every_second: Path) -> None:
    source = default_interactive("saturating")
    assert source.startswith(str(azure_every_second))
    arrivals = plan_arrivals(parse_source(source))
    assert len(arrivals) == 60  # 617.5 <= t < 677.5 in the trace: 618 ... 677
    assert arrivals[-1].arrival_s == pytest.approx(236.0)  # 59 s at a quarter speed
    assert {(r.prompt_tokens, r.output_tokens) for r in arrivals} == {(1024, 32)}  # capped


def test_short_runs_cut_the_recipe(azure_every_second: Path) -> None:
    arrivals = plan_arrivals(parse_source(default_interactive("saturating", span_s=60)))
    assert len(arrivals) == 15 and arrivals[-1].arrival_s == pytest.approx(56.0)  # 618 ... 632
    by_count = plan_arrivals(parse_source(default_interactive("saturating", 10)))
    assert len(by_count) == 10 and by_count[-1].arrival_s == pytest.approx(36.0)
    default = plan_arrivals(parse_source(default_interactive("default", 10)))
    assert len(default) == 10  # replaces the recipe's own max_requests=300
    assert shortened("a=1,max_requests=300", 10) == "a=1,max_requests=10"
    assert shortened("rate_scale=0.5", span_s=30) == "rate_scale=0.5,window_s=0-15"
    assert shortened("window_s=5-10,rate_scale=0.5", span_s=30) == "window_s=5-10,rate_scale=0.5"
    assert shortened("a=1") == "a=1"
    with pytest.raises(ValueError, match="max_requests must be >= 1"):
        shortened("a=1", 0)
    with pytest.raises(ValueError, match="span_s must be > 0"):
        shortened("a=1", span_s=0)


def test_the_saturating_recipe_sets_its_defaults_and_flags_win() -> None:
    config = BenchConfig.for_recipe(Path("x"), "saturating")
    assert config.policies == ("slice",) and config.peers == ("vllm",)
    assert config.batch == SATURATING_BATCH == "concurrency=8,prompt=1024,gen=64"
    assert config.slo_ms == 500 and config.alone_policy == "slice"
    assert config.needs_alone_run  # for the interactive TPOT alone, though the SLO is fixed
    assert config.tpot_slo_ms is None and config.tpot_slo_factor is None
    given = BenchConfig.for_recipe(Path("x"), "saturating", policies=("fcfs", "slice"),
                                   slo_ms=300.0, batch=None, tpot_slo_factor=2.0)
    assert given.policies == ("fcfs", "slice") and given.slo_ms == 300
    assert given.batch == SATURATING_BATCH and given.tpot_slo_factor == 2.0
    plain = BenchConfig.for_recipe(Path("x"), "default", slo_ms=500.0)
    assert not plain.needs_alone_run and plain.policies[0] == "fcfs"
    assert BenchConfig.for_recipe(Path("x"), "default").needs_alone_run  # measures the SLO


def test_recipe_config_errors() -> None:
    with pytest.raises(ValueError, match="unknown recipe 'light'"):
        recipe_defaults("light")
    with pytest.raises(ValueError, match="not both"):
        BenchConfig.for_recipe(Path("x"), "saturating", tpot_slo_ms=60.0, tpot_slo_factor=2.0)
    with pytest.raises(ValueError, match="tpot_slo_factor must be > 0"):
        BenchConfig.for_recipe(Path("x"), "saturating", tpot_slo_factor=0.0)
    with pytest.raises(ValueError, match="--max-requests and --span-s cut the recipe's trace"):
        BenchConfig.for_recipe(Path("x"), "saturating", span_s=60.0,
                               interactive="synthetic-coding")
    with pytest.raises(ValueError, match="include fcfs"):  # other recipes' ratios are to fcfs
        BenchConfig.for_recipe(Path("x"), "strict", policies=("slice",))
    assert set(RECIPES) == {"default", "strict", "mooncake", "saturating"}
