"""SLO bookkeeping: per-request latencies, per-class attainment, the op timeline."""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

from executors.types import OpInstance, Priority
from scheduler.api import Histogram


@dataclass(slots=True)
class ClassCounts:
    with_slo: int = 0
    met: int = 0

    @property
    def attainment(self) -> float:
        return self.met / self.with_slo if self.with_slo else 1.0


@dataclass
class Bookkeeping:
    """What the scheduler measured: TTFTs against SLOs, op executions, preemptions."""

    timeline_size: int
    timeline: deque[dict[str, Any]] = field(init=False)
    slo: dict[Priority, ClassCounts] = field(
        default_factory=lambda: defaultdict(ClassCounts))
    # the same counts per (model, class): `Request.model`, "" for one model
    slo_by_model: dict[tuple[str, Priority], ClassCounts] = field(
        default_factory=lambda: defaultdict(ClassCounts))
    rounds: Histogram = field(default_factory=Histogram)  # round times, cumulative
    recent_round_s: deque[float] = field(default_factory=lambda: deque(maxlen=10000))

    def __post_init__(self) -> None:
        self.timeline = deque(maxlen=self.timeline_size)

    def record_round(self, seconds: float) -> None:
        self.rounds.observe(seconds)
        self.recent_round_s.append(seconds)

    def record_op(self, op: OpInstance) -> None:
        if op.start is None or op.end is None:
            return
        self.timeline.append({"device": op.device, "op": op.name, "role": op.role.value,
                              "class": op.priority.label, "start": op.start, "end": op.end,
                              "cpu": op.cpu_s,
                              "num_seqs": op.shape.num_seqs, "num_tokens": op.shape.num_tokens,
                              "requests": op.request_ids, "ok": op.error is None})

    def record_ttft(self, priority: Priority, ttft_s: float, slo_s: float | None,
                    model: str = "") -> None:
        """A first token `ttft_s` after arrival, of a request of `model` with SLO `slo_s`."""
        if slo_s is None:
            return
        for c in (self.slo[priority], self.slo_by_model[(model, priority)]):
            c.with_slo += 1
            c.met += ttft_s <= slo_s

    def since(self, t: float) -> list[dict[str, Any]]:
        return [e for e in self.timeline if e["end"] >= t]
