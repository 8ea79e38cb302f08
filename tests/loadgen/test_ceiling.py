"""`loadgen ceiling`: floors by measured size, the ladder and the bracket, and a real run."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.ceiling import Floors, bracket, ceiling, floor_s, ladder, measure_floors
from loadgen.traces import TraceRequest


def _arrivals(sizes: Sequence[int]) -> list[TraceRequest]:
    return [TraceRequest(0.5 * i, n, 8) for i, n in enumerate(sizes)]


def test_a_floor_is_the_largest_measured_size_at_or_below_over_the_cores() -> None:
    floors = {100: 0.4, 300: 1.2}
    assert floor_s(floors, 99, 2) == 0.0  # below every measured size: nothing is known
    assert floor_s(floors, 100, 2) == pytest.approx(0.2)
    assert floor_s(floors, 299, 2) == pytest.approx(0.2)
    assert floor_s(floors, 300, 4) == pytest.approx(0.3)
    assert floor_s(floors, 5000, 1) == pytest.approx(1.2)


def test_the_ladder_spans_the_distinct_sizes() -> None:
    assert ladder([5, 3, 5, 9]) == [3, 5, 9]
    sizes = list(range(10, 1000, 7)) * 2
    picked = ladder(sizes, steps=8)
    assert picked[0] == 10 and picked[-1] == max(sizes) and len(picked) == 8
    assert picked == sorted(set(picked))


def test_the_bracket_is_every_unmeasured_size_at_the_slo_edge() -> None:
    sizes = [50, 100, 150, 160, 170, 200, 400]
    floors = {50: 0.2, 100: 0.4, 200: 1.2, 400: 2.0}  # one thread; 2 cores, SLO 0.5 s
    assert bracket(sizes, floors, 2, 0.5) == [150, 160, 170]
    assert bracket(sizes, floors, 2, 5.0) == []  # every measured size fits
    assert bracket(sizes, {100: 0.4, 200: 1.2}, 2, 0.1) == [50]  # none fits: all below


def test_the_ceiling_counts_the_requests_over_the_slo() -> None:
    got = ceiling(_arrivals([50, 400, 100, 401]), {50: 0.2, 100: 0.4, 400: 1.2}, 2, 0.5)
    assert [(n, f) for _, n, f in got.over] == [(400, pytest.approx(0.6)),
                                               (401, pytest.approx(0.6))]
    assert got.attainable == pytest.approx(0.5)
    assert ceiling([], {}, 2, 0.5).attainable == 1.0


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 2000), min_size=1, max_size=80),
       per_token_ms=st.floats(0.5, 5.0), slo_ms=st.floats(50.0, 3000.0))
def test_measured_floors_count_exactly_the_requests_a_monotone_cost_keeps_out(
        sizes: list[int], per_token_ms: float, slo_ms: float) -> None:
    calls: list[tuple[list[int], int]] = []

    def measure(which: Sequence[int], threads: int) -> Floors:
        calls.append((list(which), threads))
        return {n: 0.01 + per_token_ms * n / 1000 for n in which}

    floors = measure_floors(_arrivals(sizes), measure, 2, slo_ms / 1000)
    got = ceiling(_arrivals(sizes), floors, 2, slo_ms / 1000)
    exact = [n for n in sizes if (0.01 + per_token_ms * n / 1000) / 2 > slo_ms / 1000]
    assert sorted(n for _, n, _ in got.over) == sorted(exact)
    assert len(calls) <= 2 and all(t == 1 for _, t in calls)


def test_a_real_run_on_the_tiny_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    source = "synthetic-coding,max_requests=6,max_prompt_tokens=48,max_output_tokens=4"
    cmd = [sys.executable, "-m", "loadgen", "ceiling", "--interactive", source, "--model",
           str(tiny_model_dir), "--dtypes", "float32", "--repeats", "1", "--cores", "2",
           "--out", str(tmp_path)]
    # NOTE: no prefill takes less than a microsecond, so none can start within one
    tight = subprocess.run([*cmd, "--slo-ms", "0.001"], capture_output=True, text=True,
                           timeout=600, check=False)
    assert tight.returncode == 0, tight.stderr[-2000:]
    doc = json.loads((tmp_path / "ceiling.json").read_text())
    assert doc["requests"] == 6 and doc["attainable"] == 0.0 and len(doc["over"]) == 6
    assert "at most **0.0%**" in tight.stdout
    assert all(ms > 0 for ms in doc["one_thread_floor_ms"].values())
    assert doc["all_cores_measured_ms"]
    loose = subprocess.run([*cmd, "--slo-ms", "60000"], capture_output=True, text=True,
                           timeout=600, check=False)
    assert loose.returncode == 0, loose.stderr[-2000:]
    doc = json.loads((tmp_path / "ceiling.json").read_text())
    assert doc["attainable"] == 1.0 and doc["over"] == []
