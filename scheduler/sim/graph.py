"""The flattened graph a simulation walks: a snapshot's ops plus a candidate's, by position
(built once per snapshot, extended per candidate), and the two steps both event loops
share: releasing a finished op's successors and starting ready ops on free devices."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from heapq import heappop, heappush
from itertools import compress, repeat

from scheduler.sim.gmg import SimOp, Snapshot
from scheduler.sim.types import Candidate, Run


@dataclass(slots=True)
class Graph:
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


def link(nxt: list[int], more: dict[int, list[int]], j: int, i: int) -> None:
    """Add `i` to `j`'s successors (after those it has)."""
    s = nxt[j]
    if s == -1:
        nxt[j] = i
    elif s >= 0:
        nxt[j], more[j] = -2, [s, i]
    else:
        more[j] = [*more[j], i]  # NOTE: a new list: a graph's lists may be its base's


def build(snapshot: Snapshot, ops: list[SimOp], keys: list[tuple] | None = None) -> Graph:
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
                    link(nxt, more, j, i)
    firsts = dict(compress(enumerate(fto), fto))
    return Graph(ops, list(ids) if len(index) == n else [o.op_id for o in ops], index,
                  devices, where, list(map(where.__getitem__, on)), nxt, more, waiting, keys,
                  pr, firsts, list(est), list(mem_of))


def graph_of(snapshot: Snapshot, candidate: Candidate) -> Graph:
    """The snapshot's graph (cached on it) extended by the candidate's ops."""
    base = snapshot.cache.get("graph")
    if base is None:
        base = snapshot.cache["graph"] = build(snapshot, list(snapshot.ops))
    if not candidate.ops:
        return base
    new, n0, m = candidate.ops, len(base.ops), len(candidate.ops)
    ids, _, on, prio, deps, est, _, _, mem_of, fto, _ = zip(*new, strict=True)
    # NOTE: candidate ops are issued at the snapshot's time; `dispatch_key` inlined
    pr = list(map(int, prio))
    keys = base.keys + list(zip(pr, repeat(snapshot.now), ids, range(n0, n0 + m), strict=False))
    where = base.where
    if not where.keys() >= set(on) or not base.index.keys().isdisjoint(ids):
        return build(snapshot, [*base.ops, *new], keys)
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
                link(nxt, more, j, i)
    firsts = base.firsts
    if any(fto):
        firsts = {**firsts, **dict(compress(enumerate(fto, n0), fto))}
    return Graph([*base.ops, *new], base.ids + list(ids), index, base.devices, where,
                  base.dev + list(map(where.__getitem__, on)), nxt, more, waiting, keys,
                  base.pr + pr, firsts, base.dur + list(est), base.mem_of + list(mem_of))


def release(i: int, d: int, nxt: list[int], more: dict[int, list[int]], waiting: list[int],
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


def starts(g: Graph, r: Run, ready: list[list[tuple]], waiting: list[int], now: float
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
