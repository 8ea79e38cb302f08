"""What-if simulation of the GMG: a pure function of a snapshot and a candidate.

Each device runs one op at a time; a free device picks among its ready ops by
`executors.dispatch.dispatch_key`, the key whose minimum is the executors'
`pick_next`. Time advances to the earliest completion (heap entries `(time,
priority, seq, op)`), completed ops release their successors, and so on until
every op is done. Op durations are the estimates the ops carry.

NOTE: this is the scheduler's hot loop (every candidate of every round runs it), so it
works on flat lists indexed by position and keeps each device's ready ops in a heap of
`dispatch_key`s: popping that heap is `pick_next` without a scan of the ready list.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from heapq import heappop, heappush
from typing import NamedTuple

from executors.dispatch import Dispatchable, dispatch_key
from executors.types import Priority
from scheduler.gmg import SimOp, Snapshot


@dataclass(frozen=True, slots=True)
class Candidate:
    """New ops for one batch placement, issued at the snapshot's time."""

    ops: tuple[SimOp, ...]
    kv_bytes: dict[str, int] = field(default_factory=dict)  # new KV reservation per device


@dataclass(slots=True)
class Prediction:
    start: dict[int, float]
    finish: dict[int, float]
    first_token: dict[str, float]  # request id -> predicted time of its first token
    peak_bytes: dict[str, int]  # device -> predicted peak reserved bytes
    oom: bool
    end: float  # when the last op finishes

    def mean_finish(self, op_ids: list[int]) -> float:
        return sum(self.finish[i] for i in op_ids) / max(1, len(op_ids))


@dataclass(slots=True)
class _Graph:
    """The ops of a snapshot plus a candidate, flattened: op i is `ops[i]`."""

    ops: list[SimOp]
    devices: list[str]  # dispatch order: the snapshot's devices, then any others
    dev: list[int]  # op -> device index
    succ: list[list[int]]
    waiting: list[int]  # op -> unfinished deps


def _graph(snapshot: Snapshot, candidate: Candidate) -> _Graph:
    ops = [*snapshot.ops, *candidate.ops]
    index = {o.op_id: i for i, o in enumerate(ops)}
    names = [d.name for d in snapshot.devices]
    devices = names + sorted({o.device for o in ops} - set(names))
    where = {d: k for k, d in enumerate(devices)}
    succ: list[list[int]] = [[] for _ in ops]
    waiting = [0] * len(ops)
    for i, o in enumerate(ops):
        for d in o.deps:
            j = index.get(d)
            if j is not None:
                waiting[i] += 1
                succ[j].append(i)
    return _Graph(ops, devices, [where[o.device] for o in ops], succ, waiting)


class _Issued(NamedTuple):
    """A candidate op as the dispatch rule reads it: issued at the snapshot's time.

    NOTE: a tuple, not `dataclasses.replace` of the SimOp, which cost ~2 µs an op here.
    """

    priority: Priority
    issued_at: float
    op_id: int


def _keys(snapshot: Snapshot, candidate: Candidate) -> list[tuple]:
    """Each op's dispatch key with its position appended; candidate ops are issued now."""
    ops: list[Dispatchable] = [*snapshot.ops]
    ops += [_Issued(o.priority, snapshot.now, o.op_id) for o in candidate.ops]
    return [(*dispatch_key(o), i) for i, o in enumerate(ops)]


def simulate(snapshot: Snapshot, candidate: Candidate | None = None) -> Prediction:
    """Predict when every op in flight (and the candidate's) starts and finishes."""
    cand = candidate or Candidate(())
    g = _graph(snapshot, cand)
    keys = _keys(snapshot, cand)
    ops, dev, succ, waiting = g.ops, g.dev, g.succ, g.waiting
    dur = [o.est_s for o in ops]
    mem_of = [o.mem_bytes for o in ops]
    n_dev = len(g.devices)
    views = {d.name: d for d in snapshot.devices}
    mem = [views[d].reserved_bytes + cand.kv_bytes.get(d, 0) if d in views else 0
           for d in g.devices]
    peak = list(mem)
    busy = [False] * n_dev
    ready: list[list[tuple]] = [[] for _ in range(n_dev)]
    start: list[float | None] = [None] * len(ops)
    finish: list[float | None] = [None] * len(ops)
    events: list[tuple[float, int, int, int]] = []
    now = snapshot.now
    seq = 0
    for i, o in enumerate(ops):  # running ops first (remaining time), then ready ops
        if o.start is not None:
            d = dev[i]
            busy[d] = True
            start[i] = o.start
            mem[d] += mem_of[i]
            peak[d] = max(peak[d], mem[d])
            seq += 1
            heappush(events, (max(now, o.start + dur[i]), keys[i][0], seq, i))
        elif waiting[i] == 0:
            heappush(ready[dev[i]], keys[i])
    for d in range(n_dev):
        if not busy[d] and ready[d]:
            i = heappop(ready[d])[-1]
            busy[d] = True
            start[i] = now
            mem[d] += mem_of[i]
            peak[d] = max(peak[d], mem[d])
            seq += 1
            heappush(events, (now + dur[i], keys[i][0], seq, i))
    first_token: dict[str, float] = {}
    t = now
    while events:
        t, _, _, i = heappop(events)
        d = dev[i]
        busy[d] = False
        finish[i] = t
        mem[d] -= mem_of[i]
        if ops[i].first_token_of:
            for rid in ops[i].first_token_of:
                first_token[rid] = t
        woken = [d]
        for s in succ[i]:
            waiting[s] -= 1
            if waiting[s] == 0:
                heappush(ready[dev[s]], keys[s])
                woken.append(dev[s])
        for d in woken:  # the op's own device first, then its successors' (as the executors)
            if busy[d] or not ready[d]:
                continue
            j = heappop(ready[d])[-1]
            busy[d] = True
            start[j] = t
            mem[d] += mem_of[j]
            if mem[d] > peak[d]:
                peak[d] = mem[d]
            seq += 1
            heappush(events, (t + dur[j], keys[j][0], seq, j))
    caps = {d.name: d.capacity_bytes for d in snapshot.devices}
    peak_bytes = dict(zip(g.devices, peak, strict=True))
    ids = [o.op_id for o in ops]
    return Prediction(
        {ids[i]: s for i, s in enumerate(start) if s is not None},
        {ids[i]: f for i, f in enumerate(finish) if f is not None},
        first_token, peak_bytes,
        any(peak_bytes.get(d, 0) > c for d, c in caps.items()), t)
