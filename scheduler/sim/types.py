"""The simulator's inputs and outputs beyond the GMG snapshot: a candidate, a prediction,
and the results of a run in progress."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from scheduler.sim.gmg import SimOp


@dataclass(frozen=True, slots=True)
class Candidate:
    """New ops for one batch placement, issued at the snapshot's time."""

    ops: tuple[SimOp, ...]
    kv_bytes: dict[str, int] = field(default_factory=dict)  # new KV reservation per device


@dataclass(slots=True)
class Prediction:
    start: Mapping[int, float]  # op id -> predicted start
    finish: Mapping[int, float]
    first_token: dict[str, float]  # request id -> predicted time of its first token
    peak_bytes: dict[str, int]  # device -> predicted peak reserved bytes
    oom: bool
    end: float  # when the last op finishes

    def mean_finish(self, op_ids: list[int]) -> float:
        return sum(self.finish[i] for i in op_ids) / max(1, len(op_ids))


@dataclass(slots=True)
class Run:
    """The simulation's results so far, by op position and device index."""

    start: list[float | None]
    finish: list[float | None]
    mem: list[int]  # device -> reserved bytes now
    peak: list[int]  # device -> peak reserved bytes
    first_token: dict[str, float] = field(default_factory=dict)
