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
Where a C compiler works, `scheduler.sim.native` runs these same loops in C on the same
columns (arrays of them, built once per snapshot and extended per candidate): the same
predictions to the last bit, the Python loops' time cut by more than half in a round.
"""

from __future__ import annotations

from dataclasses import dataclass
from heapq import heappop, heappush, heappushpop

from scheduler.sim import native as simloop
from scheduler.sim.gmg import Snapshot
from scheduler.sim.graph import Graph, graph_of, release
from scheduler.sim.host import Hosts, Shared, classes, run_shared, sharing
from scheduler.sim.types import Candidate, Prediction, Run

_NOTHING = Candidate(())


def simulate(snapshot: Snapshot, candidate: Candidate | None = None, *,
             native: bool = True) -> Prediction:
    """Predict when every op in flight (and the candidate's) starts and finishes.

    `native`: run the event loop in C (`scheduler.sim.native`) where it was built here; it
    predicts exactly what the Python loops below do, several times faster."""
    cand = candidate or _NOTHING
    if native and simloop.library() is not None:
        return _simulate_native(snapshot, cand)
    g = graph_of(snapshot, cand)
    mem = _reserved(snapshot, cand, g.devices)
    run = Run([None] * len(g.ops), [None] * len(g.ops), mem, list(mem))
    inter = snapshot.interference
    hosts = sharing(inter, g.devices) if inter is not None else None
    if inter is not None and hosts is not None:
        classes(snapshot, g, inter)
        end = run_shared(g, run, snapshot.now, Shared(g, hosts))
    else:
        end = _run_solo(g, run, snapshot.now)
    return _prediction(snapshot, g.devices, _by_id(g.ids, run.start),
                       _by_id(g.ids, run.finish), run.first_token, run.peak, end)


def _reserved(snapshot: Snapshot, cand: Candidate, devices: list[str]) -> list[int]:
    """Bytes reserved per device at the start: the snapshot's, plus the candidate's KV."""
    views = {d.name: d for d in snapshot.devices}
    return [views[d].reserved_bytes + cand.kv_bytes.get(d, 0) if d in views else 0
            for d in devices]


def _prediction(snapshot: Snapshot, devices: list[str], start: dict[int, float],
                finish: dict[int, float], first_token: dict[str, float], peak: list[int],
                end: float) -> Prediction:
    caps = {d.name: d.capacity_bytes for d in snapshot.devices}
    peak_bytes = dict(zip(devices, peak, strict=True))
    return Prediction(start, finish, first_token, peak_bytes,
                      any(peak_bytes.get(d, 0) > c for d, c in caps.items()), end)


@dataclass(slots=True)
class _Native:
    """What `_simulate_native` keeps on a snapshot: its graph, and what every candidate on
    its devices shares (their hosts, reserved bytes and capacities)."""

    graph: simloop.Graph
    hosts: Hosts | None
    reserved: dict[str, int]  # device -> bytes reserved in the snapshot
    capacity: dict[str, int]  # device -> bytes

    @staticmethod
    def of(snapshot: Snapshot) -> _Native:
        names = [d.name for d in snapshot.devices]
        g = simloop.build(names, list(snapshot.ops), [o.issued_at for o in snapshot.ops])
        inter = snapshot.interference
        hosts = sharing(inter, g.devices) if inter is not None else None
        if inter is not None and hosts is not None:
            simloop.classes(g, g, inter)  # NOTE: each candidate's graph extends them
        return _Native(g, hosts, {d.name: d.reserved_bytes for d in snapshot.devices},
                       {d.name: d.capacity_bytes for d in snapshot.devices})


def _simulate_native(snapshot: Snapshot, cand: Candidate) -> Prediction:
    """`simulate` with the event loop in C, on its own graph (cached on the snapshot and
    extended by the candidate, as `graph_of`)."""
    ctx: _Native | None = snapshot.cache.get("native")
    if ctx is None:
        ctx = snapshot.cache["native"] = _Native.of(snapshot)
    base, inter, shared = ctx.graph, snapshot.interference, None
    g = simloop.extend(base, cand.ops, snapshot.now, inter) if cand.ops else base
    hosts = ctx.hosts if g.devices is base.devices or inter is None else sharing(
        inter, g.devices)
    if inter is not None and hosts is not None:
        simloop.classes(g, base, inter)
        shared = hosts.native
    kv, reserved = cand.kv_bytes, ctx.reserved
    mem = [reserved[d] + kv.get(d, 0) if d in reserved else 0 for d in g.devices]
    out = simloop.run(g, snapshot.now, mem, shared)
    every = out.finished == len(g.ids)  # every op started and finished
    first_token: dict[str, float] = {}
    rank, finish = out.rank, out.finish
    for i in sorted((i for i in g.firsts if rank[i] >= 0), key=rank.__getitem__):
        for rid in g.firsts[i]:  # NOTE: in order of completion, as the Python loops set them
            first_token[rid] = finish[i]
    peak = dict(zip(g.devices, out.peak, strict=True))
    return Prediction(simloop.OpTimes(g.ids, out.start, every),
                      simloop.OpTimes(g.ids, finish, every), first_token, peak,
                      any(peak.get(d, 0) > c for d, c in ctx.capacity.items()), out.end)


def _by_id(ids: list[int], times: list[float | None]) -> dict[int, float]:
    """Op id -> time, for the ops that got one (ops waiting on ops outside the graph do not)."""
    if None not in times:
        return dict(zip(ids, times, strict=True))  # type: ignore[arg-type]
    return {ids[i]: x for i, x in enumerate(times) if x is not None}


def _run_solo(g: Graph, r: Run, now: float) -> float:
    """Every op takes its estimate; returns when the last one ends."""
    ops, dev, nxt, more, keys, pr, firsts = g.ops, g.dev, g.nxt, g.more, g.keys, g.pr, g.firsts
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
            heappush(events, (max(now, o.start + dur[i]), pr[i], seq, i))
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
            heappush(events, (now + dur[i], pr[i], seq, i))
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
        woken, mine = release(i, d, nxt, more, waiting, dev, ready, keys)
        for d in woken:  # the op's own device first, then its successors' (as the executors)
            if busy[d]:
                continue
            if mine >= 0:  # NOTE: first in `woken`; push and pop at once
                j, mine = heappushpop(ready[d], keys[mine])[-1], -1
            elif ready[d]:
                j = heappop(ready[d])[-1]
            else:
                continue
            busy[d] = True
            start[j] = t
            mem[d] += mem_of[j]
            if mem[d] > peak[d]:
                peak[d] = mem[d]
            seq += 1
            heappush(events, (t + dur[j], pr[j], seq, j))
    return t
