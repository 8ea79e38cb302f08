"""`python -m benchmarks.scheduler pace`: its arguments and its trace are checked first."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.scheduler import pace
from benchmarks.scheduler.__main__ import main as bench_main
from loadgen import public_traces


def test_repeats_must_be_positive() -> None:
    with pytest.raises(SystemExit):
        pace.main(["--repeats", "0"])


def test_without_the_trace_it_fails_before_loading_the_model(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(public_traces.TRACES_ENV, str(tmp_path))
    monkeypatch.setattr(public_traces, "_BESIDE_REPO", tmp_path / "none")
    monkeypatch.setattr(pace, "load", lambda *a, **k: pytest.fail("loaded a model"))
    with pytest.raises(SystemExit) as info:
        bench_main(["pace"])
    assert "error: python -m benchmarks.scheduler pace replays the Azure LLM" in str(info.value)
