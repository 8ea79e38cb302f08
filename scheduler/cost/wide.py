"""The wide factor: how long a prefill's operator chain takes on the threads of two CPU
devices of one host (`executors.wide`) against the threads of one, timed at profiling.

A wide op's estimate is its op's estimate on one device times the factor at its chunk's
tokens (`scheduler.round.plan.Builder`). The factor depends on the prompt's length and the
machine (a short prompt splits thinly over more threads on one CPU and well on another), so
it is timed at a short and a long prompt (`Sweep.wide_tokens`) and interpolated between
them (`WideFactors`); the policy offers wide plans only from the shortest timed length
(`WIDE_MIN_TOKENS` in `scheduler.policies.candidates`).
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from models.cpu import torch_threads
from models.loader import Model
from scheduler.cost.oprunner import Clock, ShapeRunner


@dataclass(frozen=True, slots=True)
class WideFactors:
    """Timed wide factors by prefill tokens: linear between timed lengths, the nearest one's
    outside them."""

    points: tuple[tuple[int, float], ...]  # (tokens, factor), by tokens

    @classmethod
    def flat(cls, factor: float) -> WideFactors:
        return cls(((1, factor),))

    @classmethod
    def from_json(cls, value: Sequence[Sequence[float]]) -> WideFactors:
        return cls(tuple(sorted((int(n), float(f)) for n, f in value)))

    def to_json(self) -> list[list[float]]:
        return [[n, f] for n, f in self.points]

    def at(self, tokens: int) -> float:
        sizes = [n for n, _ in self.points]
        i = bisect.bisect_left(sizes, tokens)
        if i == 0:
            return self.points[0][1]
        if i == len(sizes):
            return self.points[-1][1]
        (n0, f0), (n1, f1) = self.points[i - 1], self.points[i]
        return f0 + (f1 - f0) * (tokens - n0) / (n1 - n0)

    def describe(self) -> str:
        return ", ".join(f"{f:.2f} at {n}" for n, f in self.points)


def measure_wide(model: Model, tokens: int, threads: int, repeats: int,
                 clock: Clock, block_size: int = 16) -> float:
    """Median chain time of a `tokens`-token prefill on `2 * threads` intra-op threads over
    its median on `threads`, the two interleaved (after one warm-up run of each) so a change
    in background load hits both alike. Runs in the calling thread."""
    case = ((tokens,), (0,))
    runner = ShapeRunner(model, torch.device("cpu"), [case], block_size, clock)
    batch = runner.batch(case)
    narrow: list[float] = []
    wide: list[float] = []
    for r in range(repeats + 1):
        for n, out in ((threads, narrow), (2 * threads, wide)):
            with torch_threads(n):
                seconds = sum(runner.run_once(batch))
            if r:
                out.append(seconds)
    return statistics.median(wide) / statistics.median(narrow)
