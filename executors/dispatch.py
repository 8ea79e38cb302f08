"""The dispatch rule shared by the executors and the simulator (imported, never copied)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, TypeVar

from executors.types import OpInstance, OpState, Priority


class Dispatchable(Protocol):
    """What the rule reads: executors pass OpInstances, the simulator its SimOp records."""

    @property
    def priority(self) -> Priority: ...
    @property
    def issued_at(self) -> float | None: ...
    @property
    def op_id(self) -> int: ...


D = TypeVar("D", bound=Dispatchable)


def dispatch_key(op: Dispatchable) -> tuple[int, float, int]:
    """Priority class first (high first), then the earliest-issued batch, then op id.

    NOTE: a ready op is ordered by when its batch was issued, not by when the op
    itself became ready. Ordering by the op's own ready time lets the first ops of
    every later batch overtake the continuation of an earlier one, so batches of one
    class interleave and each request's first token waits for the whole queue.
    """
    issued = op.issued_at if op.issued_at is not None else float("inf")
    return (int(op.priority), issued, op.op_id)


def pick_next(ready: Iterable[D]) -> D | None:
    """Among ready ops of one device: highest priority class, then oldest batch, then id."""
    return min(ready, key=dispatch_key, default=None)


def ready_time(op: OpInstance, now: float) -> float:
    """When `op` became ready (all deps DONE): the later of its issue time and its deps' ends.

    A missing timestamp counts as `now`. Executors store the result in `op.ready_at`
    the first time they see the op ready; `pick_next` orders by it.
    """
    t = op.issued_at if op.issued_at is not None else now
    for d in op.deps:
        t = max(t, d.end if d.end is not None else now)
    return t


def mark_issued(op: OpInstance, now: float) -> None:
    """Put `op` in a queue at `now` (state ISSUED; `issued_at` kept if the caller set it).

    NOTE: re-issuing a finished op (the retry of a FAILED op) resets its run fields and
    issues it afresh at `now`; its queued dependents keep waiting for it.
    """
    if op.state.is_finished:
        op.error = op.output = op.start = op.end = op.issued_at = None
    op.state = OpState.ISSUED
    op.ready_at = None  # the executor owns ready_at from here on
    if op.issued_at is None:
        op.issued_at = now


def scan_ready(pending: Iterable[OpInstance], now: float) -> tuple[list[OpInstance], float | None]:
    """The ops of a queue that may start at `now`, and the earliest later `ready_at` (a Recv
    waiting to retry), stamping `ready_at` on ops seen ready for the first time."""
    ready: list[OpInstance] = []
    wake: float | None = None
    for op in pending:
        if not op.is_ready:
            continue
        if op.ready_at is None:
            op.ready_at = ready_time(op, now)
        if op.ready_at <= now:
            ready.append(op)
        else:
            wake = op.ready_at if wake is None else min(wake, op.ready_at)
    return ready, wake
