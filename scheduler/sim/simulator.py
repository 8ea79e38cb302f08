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

from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from heapq import heappop, heappush, heappushpop
from itertools import chain, compress, repeat

from executors.interference import Interference
from scheduler.sim import native as simloop
from scheduler.sim.gmg import SimOp, Snapshot


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
class _Graph:
    """The ops of a snapshot plus a candidate, flattened: op i is `ops[i]`.

    Read-only once built (a simulation copies `waiting`), so the snapshot's own graph is
    built once and extended by each candidate.

    NOTE: successors are `nxt` (one op, or none) with `more` for the few ops with several,
    not a list per op: thousands of small lists made building a large graph cost as much
    as simulating it, much of it in the garbage collector.
    """

    ops: list[SimOp]
    ids: list[int]  # op -> op id
    index: dict[int, int]  # op id -> op
    devices: list[str]  # dispatch order: the snapshot's devices, then any others
    where: dict[str, int]  # device -> index
    dev: list[int]  # op -> device index
    nxt: list[int]  # op -> its successor; -1: none; -2: several (`more`)
    more: dict[int, list[int]]  # op -> its successors, for ops with several
    waiting: list[int]  # op -> unfinished deps
    keys: list[tuple]  # op -> its dispatch key with its position appended
    pr: list[int]  # op -> its priority class (its key's first item)
    firsts: dict[int, tuple[str, ...]]  # op -> requests whose first token it produces
    dur: list[float]  # op -> estimated (solo) seconds
    mem_of: list[int]  # op -> activation bytes
    cls: list[int] | None = None  # op -> interference class index (when simulated with one)


def _link(nxt: list[int], more: dict[int, list[int]], j: int, i: int) -> None:
    """Add `i` to `j`'s successors (after those it has)."""
    s = nxt[j]
    if s == -1:
        nxt[j] = i
    elif s >= 0:
        nxt[j], more[j] = -2, [s, i]
    else:
        more[j] = [*more[j], i]  # NOTE: a new list: a graph's lists may be its base's


def _build(snapshot: Snapshot, ops: list[SimOp], keys: list[tuple] | None = None) -> _Graph:
    """The graph of `ops`; `keys` None: theirs as issued (`dispatch_key`, position appended).

    NOTE: columns are read with one `zip(*ops)` (a C-level transpose of the named tuples),
    not field by field per op: a fresh snapshot's graph is a good part of its simulation.
    """
    n = len(ops)
    ids, _, on, prio, deps, est, _, _, mem_of, fto, issued = (
        zip(*ops, strict=True) if ops else ((),) * 11)
    if keys is None:  # NOTE: `dispatch_key` inlined (a SimOp's issued_at is never None)
        pr = list(map(int, prio))
        keys = list(zip(pr, issued, ids, range(n), strict=True))
    else:
        pr = [k[0] for k in keys]
    index = dict(zip(ids, range(n), strict=True))
    names = [d.name for d in snapshot.devices]
    devices = names + sorted(set(on) - set(names))
    where = {d: k for k, d in enumerate(devices)}
    nxt, waiting = [-1] * n, [0] * n
    more: dict[int, list[int]] = {}
    get = index.get
    for i, ds in enumerate(deps):
        for d in ds:
            j = get(d)
            if j is not None:
                waiting[i] += 1
                if nxt[j] == -1:
                    nxt[j] = i
                else:
                    _link(nxt, more, j, i)
    firsts = dict(compress(enumerate(fto), fto))
    return _Graph(ops, list(ids) if len(index) == n else [o.op_id for o in ops], index,
                  devices, where, list(map(where.__getitem__, on)), nxt, more, waiting, keys,
                  pr, firsts, list(est), list(mem_of))


def _graph(snapshot: Snapshot, candidate: Candidate) -> _Graph:
    """The snapshot's graph (cached on it) extended by the candidate's ops."""
    base = snapshot.cache.get("graph")
    if base is None:
        base = snapshot.cache["graph"] = _build(snapshot, list(snapshot.ops))
    if not candidate.ops:
        return base
    new, n0, m = candidate.ops, len(base.ops), len(candidate.ops)
    ids, _, on, prio, deps, est, _, _, mem_of, fto, _ = zip(*new, strict=True)
    # NOTE: candidate ops are issued at the snapshot's time; `dispatch_key` inlined
    pr = list(map(int, prio))
    keys = base.keys + list(zip(pr, repeat(snapshot.now), ids, range(n0, n0 + m), strict=False))
    where = base.where
    if not where.keys() >= set(on) or not base.index.keys().isdisjoint(ids):
        return _build(snapshot, [*base.ops, *new], keys)
    index = base.index.copy()
    index.update(zip(ids, range(n0, n0 + m), strict=True))
    nxt, more = base.nxt + [-1] * m, base.more.copy()
    waiting = base.waiting + [0] * m
    get = index.get
    for i, ds in enumerate(deps, n0):
        for d in ds:
            j = get(d)
            if j is not None:
                waiting[i] += 1
                _link(nxt, more, j, i)
    firsts = base.firsts
    if any(fto):
        firsts = {**firsts, **dict(compress(enumerate(fto, n0), fto))}
    return _Graph([*base.ops, *new], base.ids + list(ids), index, base.devices, where,
                  base.dev + list(map(where.__getitem__, on)), nxt, more, waiting, keys,
                  base.pr + pr, firsts, base.dur + list(est), base.mem_of + list(mem_of))


_NOTHING = Candidate(())


@dataclass(slots=True)
class _Run:
    """The simulation's results so far, by op position and device index."""

    start: list[float | None]
    finish: list[float | None]
    mem: list[int]  # device -> reserved bytes now
    peak: list[int]  # device -> peak reserved bytes
    first_token: dict[str, float] = field(default_factory=dict)


def simulate(snapshot: Snapshot, candidate: Candidate | None = None, *,
             native: bool = True) -> Prediction:
    """Predict when every op in flight (and the candidate's) starts and finishes.

    `native`: run the event loop in C (`scheduler.sim.native`) where it was built here; it
    predicts exactly what the Python loops below do, several times faster."""
    cand = candidate or _NOTHING
    if native and simloop.library() is not None:
        return _simulate_native(snapshot, cand)
    g = _graph(snapshot, cand)
    mem = _reserved(snapshot, cand, g.devices)
    run = _Run([None] * len(g.ops), [None] * len(g.ops), mem, list(mem))
    inter = snapshot.interference
    hosts = _sharing(inter, g.devices) if inter is not None else None
    if inter is not None and hosts is not None:
        _classes(snapshot, g, inter)
        end = _run_shared(g, run, snapshot.now, _Shared(g, hosts))
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
    hosts: _Hosts | None
    reserved: dict[str, int]  # device -> bytes reserved in the snapshot
    capacity: dict[str, int]  # device -> bytes

    @staticmethod
    def of(snapshot: Snapshot) -> _Native:
        names = [d.name for d in snapshot.devices]
        g = simloop.build(names, list(snapshot.ops), [o.issued_at for o in snapshot.ops])
        inter = snapshot.interference
        hosts = _sharing(inter, g.devices) if inter is not None else None
        if inter is not None and hosts is not None:
            simloop.classes(g, g, inter)  # NOTE: each candidate's graph extends them
        return _Native(g, hosts, {d.name: d.reserved_bytes for d in snapshot.devices},
                       {d.name: d.capacity_bytes for d in snapshot.devices})


def _simulate_native(snapshot: Snapshot, cand: Candidate) -> Prediction:
    """`simulate` with the event loop in C, on its own graph (cached on the snapshot and
    extended by the candidate, as `_graph`)."""
    ctx: _Native | None = snapshot.cache.get("native")
    if ctx is None:
        ctx = snapshot.cache["native"] = _Native.of(snapshot)
    base, inter, sharing = ctx.graph, snapshot.interference, None
    g = simloop.extend(base, cand.ops, snapshot.now, inter) if cand.ops else base
    hosts = ctx.hosts if g.devices is base.devices or inter is None else _sharing(
        inter, g.devices)
    if inter is not None and hosts is not None:
        simloop.classes(g, base, inter)
        sharing = hosts.native
    kv, reserved = cand.kv_bytes, ctx.reserved
    mem = [reserved[d] + kv.get(d, 0) if d in reserved else 0 for d in g.devices]
    out = simloop.run(g, snapshot.now, mem, sharing)
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


def _sharing(inter: Interference, devices: list[str]) -> _Hosts | None:
    """The hosts that `devices` share, if any and the model slows anything; kept on the
    model (each round's snapshots, and their candidates, run on the same devices)."""
    key = ("simulator hosts", *devices)
    if key not in inter.memo:
        inter.memo[key] = _Hosts.of(inter, devices)
    hosts: _Hosts | None = inter.memo[key]
    return hosts


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
        woken, mine = _release(i, d, nxt, more, waiting, dev, ready, keys)
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


def _run_shared(g: _Graph, r: _Run, now: float, sh: _Shared) -> float:
    """As `_run_solo`, with ops on a shared host slowed by what overlaps them there.

    NOTE: per host, `code` encodes how many ops of each class run there (one digit each)
    and `timed` is the code at the last re-timing: a completion followed by a start of
    the same class (a chain going on) leaves it unchanged, so only the new op needs a
    heap entry. Ops whose slowdown changes are settled and pushed again; `live` tells a
    popped entry from a replaced one. `executors.fake.VirtualCluster` does the same.
    """
    dev, nxt, more, keys, pr, firsts = g.dev, g.nxt, g.more, g.keys, g.pr, g.firsts
    start, finish, mem, peak = r.start, r.finish, r.mem, r.peak
    dur, mem_of, waiting = g.dur, g.mem_of, g.waiting[:]
    n, n_dev = len(dev), len(g.devices)
    host, code, timed, fresh, cls, digit = sh.host, sh.code, sh.timed, sh.fresh, sh.cls, sh.digit
    changed, members, table, factors = sh.changed, sh.members, sh.table, sh.factors
    running = [-1] * n_dev
    rem = list(dur)  # solo seconds left at `last` (ops on shared hosts)
    last = [0.0] * n
    slow = [0.0] * n  # current slowdown; 0.0 until first timed
    live = [0] * n  # seq of an op's live heap entry
    ready: list[list[tuple]] = [[] for _ in range(n_dev)]
    events: list[tuple[float, int, int, int]] = []
    seq = 0
    t = end = now
    for j, d, left in _starts(g, r, ready, waiting, now):  # begin the ops running at `now`
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
            rem[j] = left
            code[h] += digit[j]
            fresh[h].append(j)
            if h not in changed:
                changed.append(h)
    first_token = r.first_token
    while True:
        if changed:  # re-time the hosts whose running classes changed at `t`
            if len(changed) > 1:
                changed.sort()
            for h in changed:
                c, todo = code[h], fresh[h]
                if c != timed[h]:
                    timed[h] = c
                    todo = [running[d] for d in members[h] if running[d] >= 0]
                elif len(todo) > 1:  # same classes running: only the new ops need a time
                    todo.sort(key=dev.__getitem__)
                fac = table.get(c) or factors(c)
                for j in todo:
                    s = fac[cls[j]]
                    if s != slow[j]:
                        # NOTE: `interference.settle` and `finish_at`, inlined (the hot
                        # loop); the fake executors call them, and the tests prove both equal
                        if slow[j] > 0.0:
                            left = rem[j] - (t - last[j]) / slow[j]
                            rem[j] = left if left > 0.0 else 0.0
                        last[j], slow[j] = t, s
                        seq += 1
                        live[j] = seq
                        heappush(events, (t + rem[j] * s, pr[j], seq, j))
                fresh[h].clear()
            changed.clear()
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
        if i in firsts:
            for rid in firsts[i]:
                first_token[rid] = t
        woken, mine = _release(i, d, nxt, more, waiting, dev, ready, keys)
        h = host[d]
        if h >= 0 and len(woken) == 1 and (mine >= 0 or ready[d]):
            # NOTE: the common case, an op ends on a shared host and the next starts on its
            # device alone: what the re-timing would do, without its lists
            j = heappushpop(ready[d], keys[mine])[-1] if mine >= 0 else heappop(ready[d])[-1]
            running[d] = j
            start[j] = t
            mem[d] += mem_of[j]
            if mem[d] > peak[d]:
                peak[d] = mem[d]
            if digit[j] == digit[i]:  # same class: the host's slowdowns stay; time `j` alone
                s = (table.get(code[h]) or factors(code[h]))[cls[j]]
                last[j], slow[j] = t, s
                seq += 1
                live[j] = seq
                heappush(events, (t + rem[j] * s, pr[j], seq, j))
            else:
                code[h] += digit[j] - digit[i]
                fresh[h].append(j)
                changed.append(h)
            continue
        if h >= 0:
            code[h] -= digit[i]
            changed.append(h)  # NOTE: the first change since the re-timing
        for d in woken:  # the op's own device first, then its successors' (as the executors)
            if running[d] >= 0:
                continue
            if mine >= 0:  # NOTE: first in `woken`; push and pop at once
                j, mine = heappushpop(ready[d], keys[mine])[-1], -1
            elif ready[d]:
                j = heappop(ready[d])[-1]
            else:
                continue
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
                code[h] += digit[j]
                fresh[h].append(j)
                if h not in changed:
                    changed.append(h)


def _release(i: int, d: int, nxt: list[int], more: dict[int, list[int]], waiting: list[int],
             dev: list[int], ready: list[list[tuple]], keys: list[tuple]
             ) -> tuple[Sequence[int], int]:
    """Op `i` on device `d` ended: count it off its successors' deps; queue those now ready.

    Returns the devices to start an op on (`d` first, then those of the ready successors)
    and the one successor that became ready on `d` itself (-1 if none): it is not queued,
    for `d` picks at once between it and its queue (`heappushpop`, which returns it without
    touching the heap when it comes first: a chain going on on its device, the common
    case, costs no sift of a long queue).
    """
    s = nxt[i]
    if s >= 0:
        waiting[s] -= 1
        if waiting[s]:
            return (d,), -1
        e = dev[s]
        if e == d:
            return (d,), s
        heappush(ready[e], keys[s])
        return (d, e), -1
    if s == -1:
        return (d,), -1
    woken = [d]
    for s in more[i]:
        waiting[s] -= 1
        if waiting[s] == 0:
            heappush(ready[dev[s]], keys[s])
            woken.append(dev[s])
    return woken, -1


def _starts(g: _Graph, r: _Run, ready: list[list[tuple]], waiting: list[int], now: float
            ) -> list[tuple[int, int, float]]:
    """(op, device, solo seconds left) of the ops running at `now`: those running in the
    snapshot, then on each idle device its first ready op; the other ready ops queued."""
    dev, dur, keys, start = g.dev, g.dur, g.keys, r.start
    starts = []
    for i, o in enumerate(g.ops):
        if o.start is not None:
            start[i] = o.start
            starts.append((i, dev[i], max(0.0, o.start + dur[i] - now)))
        elif waiting[i] == 0:
            heappush(ready[dev[i]], keys[i])
    busy = {d for _, d, _ in starts}
    for d in range(len(g.devices)):
        if d not in busy and ready[d]:
            i = heappop(ready[d])[-1]
            start[i] = now
            starts.append((i, d, dur[i]))
    return starts


@dataclass(frozen=True, slots=True)
class _Hosts:
    """The hosts that devices share: host index per device (-1: alone), each host's devices,
    and the slowdowns per code of running classes (one base-`base` digit per class: its
    count; `powers[c]` is class c's digit, `powers[-1]` 0 for ops of no class)."""

    host: list[int]
    members: list[list[int]]
    powers: list[int]
    table: dict[int, list[float]]  # code -> slowdown per class index (filled by `factors`)
    factors: Callable[[int], list[float]]
    native: simloop.Sharing  # the same as the C loop reads it

    @staticmethod
    def of(inter: Interference, devices: list[str]) -> _Hosts | None:
        host = inter.sharing(devices)
        if inter.is_neutral() or max(host, default=-1) < 0:
            return None
        members = [[d for d, h in enumerate(host) if h == k] for k in range(max(host) + 1)]
        base = max(len(m) for m in members) + 1
        powers = [base ** c for c in range(len(inter.classes))] + [0]
        return _Hosts(host, members, powers, inter.factor_table(base),
                      partial(inter.factors, base), simloop.Sharing(
                          array("i", host), base, array("d", chain.from_iterable(inter.excess))))


class _Shared:
    """A simulation's state of the shared hosts: per host the code of the classes running
    there, that code at the last re-timing and the ops started since; the hosts changed
    since the last re-timing."""

    def __init__(self, g: _Graph, hosts: _Hosts) -> None:
        assert g.cls is not None
        self.host, self.members = hosts.host, hosts.members
        self.table, self.factors = hosts.table, hosts.factors
        self.cls = g.cls
        self.digit = list(map(hosts.powers.__getitem__, g.cls))
        n = len(hosts.members)
        self.code = [0] * n
        self.timed = [0] * n
        self.fresh: list[list[int]] = [[] for _ in range(n)]
        self.changed: list[int] = []
