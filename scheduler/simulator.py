"""What-if simulation of the GMG: a pure function of a snapshot and a candidate.

Each device runs one op at a time; a free device picks among its ready ops by
`executors.dispatch.dispatch_key`, the key whose minimum is the executors'
`pick_next`. Time advances to the earliest completion (heap entries `(time,
priority, seq, op)`), completed ops release their successors, and so on until
every op is done. Op durations are the estimates the ops carry (solo times).

Where the snapshot carries an `Interference` model and two devices of the graph
share a host, ops that overlap in simulated time on that host slow each other
down: each advances at `1 / slowdown` of its solo speed, re-evaluated whenever
the op classes running on the host change (`executors.interference`, which the
fake executors apply too). A re-timed op gets a new heap entry; the old one is
skipped when popped.

NOTE: this is the scheduler's hot loop (every candidate of every round runs it), so it
works on flat lists indexed by position and keeps each device's ready ops in a heap of
`dispatch_key`s: popping that heap is `pick_next` without a scan of the ready list.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from heapq import heappop, heappush
from typing import NamedTuple

from executors.dispatch import dispatch_key
from executors.interference import Interference
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
    """The ops of a snapshot plus a candidate, flattened: op i is `ops[i]`.

    Read-only once built (a simulation copies `waiting`), so the snapshot's own graph is
    built once and extended by each candidate.
    """

    ops: list[SimOp]
    ids: list[int]  # op -> op id
    index: dict[int, int]  # op id -> op
    devices: list[str]  # dispatch order: the snapshot's devices, then any others
    where: dict[str, int]  # device -> index
    dev: list[int]  # op -> device index
    succ: list[list[int]]
    waiting: list[int]  # op -> unfinished deps
    keys: list[tuple]  # op -> its dispatch key with its position appended
    firsts: dict[int, tuple[str, ...]]  # op -> requests whose first token it produces
    dur: list[float]  # op -> estimated (solo) seconds
    mem_of: list[int]  # op -> activation bytes
    cls: list[int] | None = None  # op -> interference class index (when simulated with one)


def _build(snapshot: Snapshot, ops: list[SimOp], keys: list[tuple]) -> _Graph:
    index = {o.op_id: i for i, o in enumerate(ops)}
    names = [d.name for d in snapshot.devices]
    devices = names + sorted({o.device for o in ops} - set(names))
    where = {d: k for k, d in enumerate(devices)}
    succ: list[list[int]] = [[] for _ in ops]
    waiting = [0] * len(ops)
    get = index.get
    for i, o in enumerate(ops):
        for d in o.deps:
            j = get(d)
            if j is not None:
                waiting[i] += 1
                succ[j].append(i)
    firsts = {i: o.first_token_of for i, o in enumerate(ops) if o.first_token_of}
    ids = list(index) if len(index) == len(ops) else [o.op_id for o in ops]
    return _Graph(ops, ids, index, devices, where, [where[o.device] for o in ops], succ,
                  waiting, keys, firsts, [o.est_s for o in ops], [o.mem_bytes for o in ops])


def _graph(snapshot: Snapshot, candidate: Candidate) -> _Graph:
    """The snapshot's graph (cached on it) extended by the candidate's ops."""
    base = snapshot.cache.get("graph")
    if base is None:
        ops = list(snapshot.ops)
        # NOTE: `dispatch_key` inlined (a SimOp's issued_at is never None); a key per op is
        # a good part of building the graph
        base = snapshot.cache["graph"] = _build(
            snapshot, ops, [(int(o.priority), o.issued_at, o.op_id, i) for i, o in enumerate(ops)])
    if not candidate.ops:
        return base
    new = candidate.ops
    n0 = len(base.ops)
    # NOTE: candidate ops are issued at the snapshot's time
    keys = base.keys + [(*dispatch_key(_Issued(o.priority, snapshot.now, o.op_id)), n0 + k)
                        for k, o in enumerate(new)]
    where = base.where
    if any(o.device not in where for o in new) or any(o.op_id in base.index for o in new):
        return _build(snapshot, [*base.ops, *new], keys)
    index = base.index.copy()
    for k, o in enumerate(new):
        index[o.op_id] = n0 + k
    succ = base.succ + [[] for _ in new]
    waiting = base.waiting + [0] * len(new)
    extended: set[int] = set()  # snapshot ops whose successor list was copied
    for k, o in enumerate(new):
        i = n0 + k
        for d in o.deps:
            j = index.get(d)
            if j is not None:
                waiting[i] += 1
                if j < n0 and j not in extended:
                    succ[j] = list(succ[j])
                    extended.add(j)
                succ[j].append(i)
    firsts = base.firsts
    if any(o.first_token_of for o in new):
        firsts = {**firsts, **{n0 + k: o.first_token_of for k, o in enumerate(new)
                               if o.first_token_of}}
    ops = [*base.ops, *new]
    ids = base.ids + [o.op_id for o in new]
    return _Graph(ops, ids, index, base.devices, where, base.dev + [where[o.device] for o in new],
                  succ, waiting, keys, firsts, base.dur + [o.est_s for o in new],
                  base.mem_of + [o.mem_bytes for o in new])


class _Issued(NamedTuple):
    """A candidate op as the dispatch rule reads it: issued at the snapshot's time.

    NOTE: a tuple, not `dataclasses.replace` of the SimOp, which cost ~2 µs an op here.
    """

    priority: Priority
    issued_at: float
    op_id: int


@dataclass(slots=True)
class _Run:
    """The simulation's results so far, by op position and device index."""

    start: list[float | None]
    finish: list[float | None]
    mem: list[int]  # device -> reserved bytes now
    peak: list[int]  # device -> peak reserved bytes
    first_token: dict[str, float] = field(default_factory=dict)


def simulate(snapshot: Snapshot, candidate: Candidate | None = None) -> Prediction:
    """Predict when every op in flight (and the candidate's) starts and finishes."""
    cand = candidate or Candidate(())
    g = _graph(snapshot, cand)
    views = {d.name: d for d in snapshot.devices}
    mem = [views[d].reserved_bytes + cand.kv_bytes.get(d, 0) if d in views else 0
           for d in g.devices]
    run = _Run([None] * len(g.ops), [None] * len(g.ops), mem, list(mem))
    inter = snapshot.interference
    host = inter.sharing(g.devices) if inter is not None and not inter.is_neutral() else None
    if inter is not None and host is not None and max(host, default=-1) >= 0:
        _classes(snapshot, g, inter)
        end = _run_shared(g, run, snapshot.now, inter, host)
    else:
        end = _run_solo(g, run, snapshot.now)
    caps = {d.name: d.capacity_bytes for d in snapshot.devices}
    peak_bytes = dict(zip(g.devices, run.peak, strict=True))
    return Prediction(_by_id(g.ids, run.start), _by_id(g.ids, run.finish),
                      run.first_token, peak_bytes,
                      any(peak_bytes.get(d, 0) > c for d, c in caps.items()), end)


def _by_id(ids: list[int], times: list[float | None]) -> dict[int, float]:
    """Op id -> time, for the ops that got one (ops waiting on ops outside the graph do not)."""
    if None not in times:
        return dict(zip(ids, times, strict=True))  # type: ignore[arg-type]
    return {ids[i]: x for i, x in enumerate(times) if x is not None}


def _classes(snapshot: Snapshot, g: _Graph, inter: Interference) -> None:
    """Fill `g.cls`, from the snapshot's own graph's where it has them."""
    if g.cls is not None:
        return
    base = snapshot.cache["graph"]
    if base.cls is None:
        base.cls = inter.class_indices([o.name for o in base.ops])
    g.cls = base.cls if g is base else base.cls + inter.class_indices(
        [o.name for o in g.ops[len(base.ops):]])


def _run_solo(g: _Graph, r: _Run, now: float) -> float:
    """Every op takes its estimate; returns when the last one ends."""
    ops, dev, succ, keys, firsts = g.ops, g.dev, g.succ, g.keys, g.firsts
    start, finish, mem, peak = r.start, r.finish, r.mem, r.peak
    dur, mem_of, waiting = g.dur, g.mem_of, g.waiting[:]
    n_dev = len(g.devices)
    busy = [False] * n_dev
    ready: list[list[tuple]] = [[] for _ in range(n_dev)]
    events: list[tuple[float, int, int, int]] = []
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
    first_token = r.first_token
    t = now
    while events:
        t, _, _, i = heappop(events)
        d = dev[i]
        busy[d] = False
        finish[i] = t
        mem[d] -= mem_of[i]
        if i in firsts:
            for rid in firsts[i]:
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
    return t


def _run_shared(g: _Graph, r: _Run, now: float, inter: Interference, host: list[int]) -> float:
    """As `_run_solo`, with ops on a shared host slowed by what overlaps them there.

    NOTE: per host, `code` encodes how many ops of each class run there (one digit each)
    and `timed` is the code at the last re-timing: a completion followed by a start of
    the same class (a chain going on) leaves it unchanged, so only the new op needs a
    heap entry. Ops whose slowdown changes are settled and pushed again; `live` tells a
    popped entry from a replaced one. `executors.fake.VirtualCluster` does the same.
    """
    ops, dev, succ, keys, firsts = g.ops, g.dev, g.succ, g.keys, g.firsts
    start, finish, mem, peak = r.start, r.finish, r.mem, r.peak
    dur, mem_of, waiting = g.dur, g.mem_of, g.waiting[:]
    n, n_dev = len(ops), len(g.devices)
    sh = _Shared(g, inter, host)
    code, timed, fresh, dirty, cls, digit = sh.code, sh.timed, sh.fresh, sh.dirty, sh.cls, sh.digit
    pr = [k[0] for k in keys]
    running = [-1] * n_dev
    rem = list(dur)  # solo seconds left at `last` (ops on shared hosts)
    last = [0.0] * n
    slow = [0.0] * n  # current slowdown; 0.0 until first timed
    live = [0] * n  # seq of an op's live heap entry
    ready: list[list[tuple]] = [[] for _ in range(n_dev)]
    events: list[tuple[float, int, int, int]] = []
    seq = 0
    starts: list[tuple[int, int, float]] = []  # (op, device, solo seconds left) at `now`
    for i, o in enumerate(ops):  # running ops first (remaining time), then ready ops
        if o.start is not None:
            start[i] = o.start
            starts.append((i, dev[i], max(0.0, o.start + dur[i] - now)))
        elif waiting[i] == 0:
            heappush(ready[dev[i]], keys[i])
    busy = {d for _, d, _ in starts}
    for d in range(n_dev):
        if d not in busy and ready[d]:
            i = heappop(ready[d])[-1]
            start[i] = now
            starts.append((i, d, dur[i]))
    first_token = r.first_token
    factors, hosts, members = sh.factors, sh.hosts, sh.members
    t = end = now
    for j, d, left in starts:  # begin the ops running at `now`
        running[d] = j
        mem[d] += mem_of[j]
        if mem[d] > peak[d]:
            peak[d] = mem[d]
        h = host[d]
        if h < 0:
            seq += 1
            live[j] = seq
            heappush(events, (t + left, pr[j], seq, j))
        else:
            rem[j], last[j] = left, t
            code[h] += digit[j]
            fresh[h].append(j)
            dirty[h] = True
    while True:
        for h in hosts:  # re-time the hosts whose running classes changed at `t`
            if not dirty[h]:
                continue
            dirty[h] = False
            c = code[h]
            if c == timed[h]:  # same classes running: only the new ops need a time
                todo = fresh[h] if len(fresh[h]) < 2 else sorted(fresh[h], key=dev.__getitem__)
            else:
                timed[h] = c
                todo = [running[d] for d in members[h] if running[d] >= 0]
            fac = factors.get(c) or sh.factors_of(c)
            for j in todo:
                s = fac[cls[j]]
                if s != slow[j]:
                    # NOTE: `interference.settle` and `finish_at`, inlined (the hot loop);
                    # the fake executors call them, and the simulator tests prove both equal
                    if slow[j] > 0.0:
                        left = rem[j] - (t - last[j]) / slow[j]
                        rem[j] = left if left > 0.0 else 0.0
                    last[j], slow[j] = t, s
                    seq += 1
                    live[j] = seq
                    heappush(events, (t + rem[j] * s, pr[j], seq, j))
            fresh[h].clear()
        while events:
            t, _, sq, i = heappop(events)
            if live[i] == sq:
                break
        else:
            return end  # NOTE: not `t`, which may be a replaced entry's (a later time)
        end = t
        d = dev[i]
        running[d] = -1
        finish[i] = t
        mem[d] -= mem_of[i]
        h = host[d]
        if h >= 0:
            code[h] -= digit[i]
            dirty[h] = True
        if i in firsts:
            for rid in firsts[i]:
                first_token[rid] = t
        woken = [d]
        for s_ in succ[i]:
            waiting[s_] -= 1
            if waiting[s_] == 0:
                heappush(ready[dev[s_]], keys[s_])
                woken.append(dev[s_])
        for d in woken:  # the op's own device first, then its successors' (as the executors)
            if running[d] >= 0 or not ready[d]:
                continue
            j = heappop(ready[d])[-1]
            running[d] = j
            start[j] = t
            mem[d] += mem_of[j]
            if mem[d] > peak[d]:
                peak[d] = mem[d]
            h = host[d]
            if h < 0:
                seq += 1
                live[j] = seq
                heappush(events, (t + dur[j], pr[j], seq, j))
            else:
                rem[j], last[j] = dur[j], t
                code[h] += digit[j]
                fresh[h].append(j)
                dirty[h] = True


class _Shared:
    """The hosts that devices of a graph share: per host its devices, the code of the
    classes running there (one base-`base` digit per class), that code at the last
    re-timing, the ops started since, and slowdowns per code (cached)."""

    def __init__(self, g: _Graph, inter: Interference, host: list[int]) -> None:
        self.inter = inter
        self.hosts = range(max(host) + 1)
        self.members = [[d for d, h in enumerate(host) if h == k] for k in self.hosts]
        self.base = max(len(m) for m in self.members) + 1
        assert g.cls is not None
        self.cls = g.cls
        self.digit = [self.base ** c if c >= 0 else 0 for c in self.cls]
        self.code = [0] * len(self.hosts)
        self.timed = [0] * len(self.hosts)
        self.fresh: list[list[int]] = [[] for _ in self.hosts]
        self.dirty = [False] * len(self.hosts)
        self.factors: dict[int, list[float]] = {}  # code -> slowdown per class index

    def factors_of(self, code: int) -> list[float]:
        """Slowdown per class index for a host running `code` (index -1: 1.0), cached."""
        n_cls = len(self.inter.classes)
        counts = [code // self.base ** k % self.base for k in range(n_cls)]
        fac = self.factors[code] = [self.inter.factor(k, counts) for k in range(n_cls)] + [1.0]
        return fac
