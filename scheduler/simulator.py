"""What-if simulation of the GMG: a pure function of a snapshot and a candidate.

Each device runs one op at a time; a free device picks among its ready ops
with `executors.dispatch.pick_next`, the rule the executors use. Time
advances to the earliest completion (heap entries `(time, priority, seq,
op)`), completed ops release their successors, and so on until every op is
done. Op durations are the estimates the ops carry.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field, replace

from executors.dispatch import pick_next
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
class _Sim:
    now: float
    ops: dict[int, SimOp]
    waiting: dict[int, int]  # op id -> unfinished deps
    succ: dict[int, list[int]]
    ready: dict[str, list[SimOp]]  # device -> ready ops
    busy: dict[str, bool]
    mem: dict[str, int]
    pred: Prediction
    heap: list[tuple[float, int, int, int]]
    seq: int = 0


def _init(snapshot: Snapshot, candidate: Candidate) -> _Sim:
    now = snapshot.now
    new = [replace(o, ready_floor=max(o.ready_floor, now), issued_at=now) for o in candidate.ops]
    ops = {o.op_id: o for o in (*snapshot.ops, *new)}
    succ: dict[int, list[int]] = {i: [] for i in ops}
    waiting = {}
    for o in ops.values():
        deps = [d for d in o.deps if d in ops]
        waiting[o.op_id] = len(deps)
        for d in deps:
            succ[d].append(o.op_id)
    mem = {d.name: d.reserved_bytes + candidate.kv_bytes.get(d.name, 0)
           for d in snapshot.devices}
    pred = Prediction({}, {}, {}, dict(mem), False, now)
    names = [d.name for d in snapshot.devices]
    devices = names + sorted({o.device for o in ops.values()} - set(names))  # dispatch order
    return _Sim(now, ops, waiting, succ, {d: [] for d in devices}, dict.fromkeys(devices, False),
                mem, pred, [])


def _start(sim: _Sim, op: SimOp, t: float) -> None:
    sim.busy[op.device] = True
    sim.pred.start[op.op_id] = t
    sim.mem[op.device] = sim.mem.get(op.device, 0) + op.mem_bytes
    sim.pred.peak_bytes[op.device] = max(sim.pred.peak_bytes.get(op.device, 0),
                                         sim.mem[op.device])
    sim.seq += 1
    heapq.heappush(sim.heap, (t + op.est_s, int(op.priority), sim.seq, op.op_id))


def _dispatch(sim: _Sim, device: str, t: float) -> None:
    if sim.busy[device] or not sim.ready[device]:
        return
    op = pick_next(sim.ready[device])
    assert op is not None
    sim.ready[device].remove(op)
    _start(sim, op, t)


def _seed(sim: _Sim) -> None:
    """Running ops first (remaining time), then ready ops in dispatch order."""
    for o in sim.ops.values():
        if o.start is not None:
            sim.busy[o.device] = True
            sim.pred.start[o.op_id] = o.start
            end = max(sim.now, o.start + o.est_s)
            sim.mem[o.device] = sim.mem.get(o.device, 0) + o.mem_bytes
            sim.seq += 1
            heapq.heappush(sim.heap, (end, int(o.priority), sim.seq, o.op_id))
        elif sim.waiting[o.op_id] == 0:
            sim.ready[o.device].append(o)
    for d in sim.ready:
        _dispatch(sim, d, sim.now)


def _complete(sim: _Sim, op: SimOp, t: float) -> None:
    sim.busy[op.device] = False
    sim.pred.finish[op.op_id] = t
    sim.mem[op.device] -= op.mem_bytes
    for rid in op.first_token_of:
        sim.pred.first_token[rid] = t
    for s in sim.succ[op.op_id]:
        sim.waiting[s] -= 1
        if sim.waiting[s] == 0:
            nxt = sim.ops[s]
            sim.ready[nxt.device].append(replace(nxt, ready_floor=max(nxt.ready_floor, t)))


def simulate(snapshot: Snapshot, candidate: Candidate | None = None) -> Prediction:
    """Predict when every op in flight (and the candidate's) starts and finishes."""
    sim = _init(snapshot, candidate or Candidate(()))
    _seed(sim)
    t = sim.now
    while sim.heap:
        t, _, _, op_id = heapq.heappop(sim.heap)
        op = sim.ops[op_id]
        _complete(sim, op, t)
        _dispatch(sim, op.device, t)
        for s in sim.succ[op_id]:
            _dispatch(sim, sim.ops[s].device, t)
    sim.pred.end = t
    caps = {d.name: d.capacity_bytes for d in snapshot.devices}
    sim.pred.oom = any(sim.pred.peak_bytes.get(d, 0) > c for d, c in caps.items())
    return sim.pred
