"""The host model: devices that share a host slow each other's ops down.

Ops that overlap in simulated time on a shared host each advance at `1 / slowdown` of
their solo speed, re-evaluated whenever the op classes running on the host change
(`executors.interference`, which the fake executors apply too). A re-timed op gets a new
heap entry; the old one is skipped when popped.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from heapq import heappop, heappush, heappushpop
from itertools import chain

from executors.interference import Interference
from scheduler.sim import native as simloop
from scheduler.sim.gmg import Snapshot
from scheduler.sim.graph import Graph, release, starts
from scheduler.sim.types import Run


def sharing(inter: Interference, devices: list[str]) -> Hosts | None:
    """The hosts that `devices` share, if any and the model slows anything; kept on the
    model (each round's snapshots, and their candidates, run on the same devices)."""
    key = ("simulator hosts", *devices)
    if key not in inter.memo:
        inter.memo[key] = Hosts.of(inter, devices)
    hosts: Hosts | None = inter.memo[key]
    return hosts


def classes(snapshot: Snapshot, g: Graph, inter: Interference) -> None:
    """Fill `g.cls`, from the snapshot's own graph's where it has them."""
    if g.cls is not None:
        return
    base = snapshot.cache["graph"]
    if base.cls is None:
        base.cls = inter.class_indices([o.name for o in base.ops])
    g.cls = base.cls if g is base else base.cls + inter.class_indices(
        [o.name for o in g.ops[len(base.ops):]])


def run_shared(g: Graph, r: Run, now: float, sh: Shared) -> float:
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
    for j, d, left in starts(g, r, ready, waiting, now):  # begin the ops running at `now`
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
        woken, mine = release(i, d, nxt, more, waiting, dev, ready, keys)
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


@dataclass(frozen=True, slots=True)
class Hosts:
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
    def of(inter: Interference, devices: list[str]) -> Hosts | None:
        host = inter.sharing(devices)
        if inter.is_neutral() or max(host, default=-1) < 0:
            return None
        members = [[d for d, h in enumerate(host) if h == k] for k in range(max(host) + 1)]
        base = max(len(m) for m in members) + 1
        powers = [base ** c for c in range(len(inter.classes))] + [0]
        return Hosts(host, members, powers, inter.factor_table(base),
                      partial(inter.factors, base), simloop.Sharing(
                          array("i", host), base, array("d", chain.from_iterable(inter.excess))))


class Shared:
    """A simulation's state of the shared hosts: per host the code of the classes running
    there, that code at the last re-timing and the ops started since; the hosts changed
    since the last re-timing."""

    def __init__(self, g: Graph, hosts: Hosts) -> None:
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
