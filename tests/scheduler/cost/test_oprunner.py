"""The profiling sweep's runner: a pause hook between ops, off their clock."""

from __future__ import annotations

from pathlib import Path

import torch

from models.loader import load
from scheduler.cost.oprunner import ShapeRunner


def test_the_pause_runs_before_every_op_and_is_not_timed(tiny_model_dir: Path) -> None:
    model = load(tiny_model_dir, dtype="float32")
    cases = [((8,), (0,)), ((1, 1), (4, 9))]
    ticks = iter(range(10_000))
    runner = ShapeRunner(model, torch.device("cpu"), cases, clock=lambda: float(next(ticks)))
    calls = []

    def pause() -> None:
        calls.append(1)
        next(ticks)  # a wait of one tick, which no op's time may include

    samples = runner.sample_all(cases, repeats=2, pause=pause)
    assert len(calls) == 3 * len(cases) * len(model.template.ops)  # warm-up round + 2
    assert all(t == 1.0 for s in samples for op in s.runs for t in op)
