"""The policies bench's repeat bookkeeping: interleaved order, medians, side-by-side ratios."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks.scheduler import policies
from benchmarks.scheduler.__main__ import main as bench_main
from benchmarks.scheduler.policies import goal_lines, main, medians, repeated
from loadgen import public_traces


def _row(lp: float, total: float) -> dict[str, float]:
    return {"lp_tok_s": lp, "total_tok_s": total, "hp_slo_attainment": 1.0}


def test_each_repeat_starts_one_policy_later() -> None:
    calls: list[str] = []
    runs = repeated(["a", "b", "c"], 4, lambda n: calls.append(n) or _row(1, 1))
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b", "a", "b", "c"]
    assert [list(r) for r in runs] == [["a", "b", "c"]] * 4  # stored in the asked order


def test_ratios_are_taken_within_a_repeat_then_medianed() -> None:
    runs = [
        {"fcfs": _row(100, 200), "static": _row(50, 100), "slice": _row(90, 190)},
        {"fcfs": _row(80, 100), "static": _row(60, 80), "slice": _row(78, 98)},
        {"fcfs": _row(100, 150), "static": _row(40, 60), "slice": _row(70, 150)},
    ]
    rows = medians(runs)
    assert rows["slice"]["total_vs_fcfs"] == pytest.approx(0.98)  # of 0.95, 0.98, 1.0
    assert rows["slice"]["lp_vs_fcfs"] == pytest.approx(0.9)  # of 0.9, 0.975, 0.7
    assert rows["slice"]["total_tok_s"] == 150  # the median figure itself
    assert rows["fcfs"]["total_vs_fcfs"] == 1.0
    # NOTE: a ratio of medians would say 150/150 = 1.0 for total and 78/100 = 0.78 for LP


def test_ratio_without_its_baseline_is_nan() -> None:
    rows = medians([{"slice": _row(1, 1)}])
    assert math.isnan(rows["slice"]["total_vs_fcfs"])
    assert math.isnan(rows["slice"]["lp_vs_fcfs"])


def test_goals_are_checked_on_the_medians() -> None:
    rows = medians([{"fcfs": _row(100, 200), "slice": _row(96, 193)}])
    assert goal_lines(rows) == [
        "- slice: HP SLO attainment 100.0% >= 99%: met",
        "- slice: total tok/s 0.96x fcfs >= 0.97x: MISSED",
        "- slice: LP tok/s 0.96x fcfs >= 0.95x: met"]
    assert goal_lines({}) == ["- slice did not run: no goal can be checked"]


def test_repeats_must_be_positive() -> None:
    with pytest.raises(SystemExit):
        main(["--repeats", "0"])


def test_without_the_trace_it_fails_before_loading_the_model(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(public_traces.TRACES_ENV, str(tmp_path))
    monkeypatch.setattr(public_traces, "_BESIDE_REPO", tmp_path / "none")
    monkeypatch.setattr(policies, "load", lambda *a, **k: pytest.fail("loaded a model"))
    with pytest.raises(SystemExit) as info:
        bench_main(["policies"])
    assert "error: python -m benchmarks.scheduler policies replays the Azure LLM" in str(
        info.value)
