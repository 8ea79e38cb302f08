"""A straightforward reference for `scheduler.sim.simulator.simulate`, for equivalence tests.

It follows the same rules as the simulator, written for reading rather than speed: ops as
records in dicts, each device's ready ops scanned with `pick_next`, and after every event
every running op of a shared host re-timed from the classes running there (with
`Interference.factor`, `settle` and `finish_at`), where the simulator keeps flat lists,
heaps of dispatch keys and slowdowns cached per set of running classes. Heap entries are
`(time, priority, seq, op)` in both, with the same seq order, so the two agree exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from heapq import heappop, heappush

from executors.dispatch import pick_next
from executors.interference import Interference, finish_at, settle
from executors.types import Priority
from scheduler.sim.gmg import SimOp, Snapshot
from scheduler.sim.types import Candidate, Prediction


@dataclass
class _Op:
    pos: int  # position in the graph: snapshot ops, then the candidate's
    sim: SimOp
    priority: Priority
    issued_at: float
    op_id: int
    device: str
    cls: int = -1
    waiting: int = 0
    start: float | None = None
    finish: float | None = None
    rem_s: float = 0.0  # solo seconds left at `last`
    last: float = 0.0
    slow: float = 0.0
    live: int = -1  # seq of its live heap entry


def reference(snapshot: Snapshot, candidate: Candidate | None = None) -> Prediction:
    now = snapshot.now
    sims = [*snapshot.ops, *(candidate.ops if candidate else ())]
    n0 = len(snapshot.ops)
    ops = [_Op(i, o, o.priority, o.issued_at if i < n0 else now, o.op_id, o.device)
           for i, o in enumerate(sims)]
    by_id = {o.op_id: o for o in ops}
    names = [d.name for d in snapshot.devices]
    devices = names + sorted({o.device for o in ops} - set(names))
    succ: dict[int, list[_Op]] = {o.pos: [] for o in ops}
    for o in ops:
        for d in o.sim.deps:
            if d in by_id:
                o.waiting += 1
                succ[by_id[d].pos].append(o)
    kv = candidate.kv_bytes if candidate else {}
    views = {d.name: d for d in snapshot.devices}
    mem = {d: views[d].reserved_bytes + kv.get(d, 0) if d in views else 0 for d in devices}
    inter = snapshot.interference
    host = inter.sharing(devices) if inter is not None and not inter.is_neutral() else None
    shared = inter is not None and host is not None and max(host, default=-1) >= 0
    if shared:
        assert inter is not None
        for o in ops:
            o.cls = inter.class_index(o.sim.name)
    sim = _Sim(ops, devices, dict(zip(devices, host or [-1] * len(devices), strict=True)),
               inter if shared else None, succ, mem, now)
    end = sim.run()
    caps = {d.name: d.capacity_bytes for d in snapshot.devices}
    return Prediction({o.op_id: o.start for o in ops if o.start is not None},
                      {o.op_id: o.finish for o in ops if o.finish is not None},
                      sim.first_token, sim.peak,
                      any(sim.peak.get(d, 0) > c for d, c in caps.items()), end)


class _Sim:
    def __init__(self, ops: list[_Op], devices: list[str], host: dict[str, int],
                 inter: Interference | None, succ: dict[int, list[_Op]],
                 mem: dict[str, int], now: float) -> None:
        self.ops, self.devices, self.host, self.inter = ops, devices, host, inter
        self.succ, self.mem, self.peak = succ, mem, dict(mem)
        self.now = now
        self.running: dict[str, _Op] = {}
        self.ready: dict[str, list[_Op]] = {d: [] for d in devices}
        self.events: list[tuple[float, int, int, int]] = []
        self.seq = 0
        self.changed: set[int] = set()  # hosts whose running ops changed at this time
        self.first_token: dict[str, float] = {}

    def push(self, o: _Op, t: float) -> None:
        self.seq += 1
        o.live = self.seq
        heappush(self.events, (t, int(o.priority), self.seq, o.pos))

    def begin(self, o: _Op, t: float, left: float) -> None:
        """`o` runs on its device from `t` with `left` solo seconds to go."""
        self.running[o.device] = o
        self.mem[o.device] += o.sim.mem_bytes
        self.peak[o.device] = max(self.peak[o.device], self.mem[o.device])
        h = self.host[o.device]
        if self.inter is None or h < 0:
            self.push(o, t + left)
        else:
            o.rem_s, o.last = left, t
            self.changed.add(h)

    def pick(self, d: str) -> _Op | None:
        o = pick_next(self.ready[d])
        if o is not None:
            self.ready[d].remove(o)
        return o

    def run(self) -> float:
        now = self.now
        running_now = [(o, o.sim.start) for o in self.ops if o.sim.start is not None]
        for o in self.ops:
            if o.sim.start is None and o.waiting == 0:
                self.ready[o.device].append(o)
        if self.inter is None:
            for o, began in running_now:  # the solo path times a running op by its end
                o.start = began
                self.running[o.device] = o
                self.mem[o.device] += o.sim.mem_bytes
                self.peak[o.device] = max(self.peak[o.device], self.mem[o.device])
                self.seq += 1
                o.live = self.seq
                heappush(self.events, (max(now, began + o.sim.est_s), int(o.priority),
                                       self.seq, o.pos))
        else:
            for o, began in running_now:
                o.start = began
                self.begin(o, now, max(0.0, began + o.sim.est_s - now))
        busy = {o.device for o, _ in running_now}
        for d in self.devices:
            if d not in busy and (first := self.pick(d)) is not None:
                first.start = now
                self.begin(first, now, first.sim.est_s)
        end = now
        while True:
            self.retime(end)
            while self.events:
                t, _, seq, pos = heappop(self.events)
                if self.ops[pos].live == seq:
                    break
            else:
                return end
            end = t
            self.complete(self.ops[pos], t)

    def complete(self, o: _Op, t: float) -> None:
        o.finish = t
        del self.running[o.device]
        self.mem[o.device] -= o.sim.mem_bytes
        if self.host[o.device] >= 0:
            self.changed.add(self.host[o.device])
        for rid in o.sim.first_token_of:
            self.first_token[rid] = t
        woken = [o.device]
        for s in self.succ[o.pos]:
            s.waiting -= 1
            if s.waiting == 0:
                self.ready[s.device].append(s)
                woken.append(s.device)
        for d in woken:  # the op's own device first, then its successors'
            if d not in self.running and (nxt := self.pick(d)) is not None:
                nxt.start = t
                self.begin(nxt, t, nxt.sim.est_s)

    def retime(self, t: float) -> None:
        """Every running op of a host whose ops changed: its slowdown from the classes
        running there now; where that differs, settle its progress and time it anew."""
        assert self.inter is not None or not self.changed
        for h in sorted(self.changed):
            on = [self.running[d] for d in self.devices
                  if self.host[d] == h and d in self.running]
            counts = [0] * len(self.inter.classes)  # type: ignore[union-attr]
            for o in on:
                if o.cls >= 0:
                    counts[o.cls] += 1
            for o in on:
                s = self.inter.factor(o.cls, counts)  # type: ignore[union-attr]
                if s != o.slow:
                    if o.slow > 0.0:
                        o.rem_s = settle(o.rem_s, o.last, o.slow, t)
                    o.last, o.slow = t, s
                    self.push(o, finish_at(t, o.rem_s, s))
        self.changed.clear()
