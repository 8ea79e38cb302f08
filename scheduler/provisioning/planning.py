"""Operator-level provisioning (OpScale): how many replicas of each operator, and where.

Every interval the provisioner measures, per operator of the chain, the
arrival rate of its op instances and their mean estimated service time (the
estimators at the observed batch sizes), and plans:

1. the smallest replica count that keeps that operator's queue stable, then
   the count whose Erlang-C mean wait stays within the operator's share of the
   tightest TTFT SLO (the slack the SLO leaves over the chain's service time,
   split in proportion to service time);
2. the placement of added replicas by best fit on memory and predicted load,
   preferring devices that already hold a neighbouring operator (fewer
   transfers), then devices already in use (idle ones stay releasable);
   removals empty the least-used devices first, and only when the count is
   above what 25% more load would need (no flapping).

`plan_model` is the model-level baseline: whole-model replicas sized by the
prompt tokens pending. The plans are pure functions of their inputs; the
scheduler-facing loop that measures, checks plans by what-if simulation and
actuates them is `scheduler/provisioning/provisioner.py`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from scheduler.memory.replicas import Change
from scheduler.provisioning.queueing import replicas_for

SCALE_DOWN_HEADROOM = 1.25  # remove a replica only if this much more load would not need it
MAX_UTIL = 0.9  # predicted utilisation a device is filled to


@dataclass(frozen=True, slots=True)
class OpLoad:
    """Demand on one operator: op instances per second and their mean seconds each."""

    arrivals_per_s: float
    service_s: float

    @property
    def erlangs(self) -> float:
        return self.arrivals_per_s * self.service_s


@dataclass(frozen=True, slots=True)
class Cluster:
    """What a plan starts from."""

    devices: tuple[str, ...]
    held: Mapping[str, frozenset[int]]  # device -> operators held (loading or ready)
    removable: frozenset[tuple[int, str]]  # (operator, device): ready, not the last one
    room_bytes: Mapping[str, int]  # device -> bytes a new replica may take there
    weight_bytes: tuple[int, ...]  # operator -> bytes of its weights
    draining: frozenset[tuple[int, str]] = frozenset()  # (operator, device) being removed

    def count(self, index: int) -> int:
        return sum(index in ops for ops in self.held.values())


@dataclass(frozen=True, slots=True)
class ProvisionPlan:
    adds: tuple[Change, ...]
    removes: tuple[Change, ...]
    target: tuple[int, ...]  # replicas per operator the plan aims at
    idle: tuple[str, ...]  # devices holding nothing once the plan is carried out

    @property
    def empty(self) -> bool:
        return not self.adds and not self.removes


def wait_budgets(loads: list[OpLoad], slo_s: float) -> list[float]:
    """Each operator's share of the SLO's slack over the chain's service time."""
    total = sum(x.service_s for x in loads)
    slack = max(0.0, slo_s - total)
    if total <= 0:
        return [slack / max(1, len(loads))] * len(loads)
    return [slack * x.service_s / total for x in loads]


def targets(loads: list[OpLoad], slo_s: float, max_replicas: int, scale: float = 1.0
            ) -> list[int]:
    """Replicas per operator: stable, then within its Erlang-C wait budget."""
    budgets = wait_budgets(loads, slo_s)
    return [replicas_for(x.arrivals_per_s * scale, x.service_s, b, max_replicas)
            for x, b in zip(loads, budgets, strict=True)]


class _Layout:
    """A plan's working copy of who holds what, with predicted utilisation per device: each
    replica of an operator takes an equal share of its Erlangs."""

    def __init__(self, cluster: Cluster, loads: list[OpLoad]) -> None:
        self.c = cluster
        self.erlangs = [x.erlangs for x in loads]
        self.held = {d: set(cluster.held.get(d, ())) for d in cluster.devices}
        self.count = [cluster.count(i) for i in range(len(loads))]
        self.room = dict(cluster.room_bytes)
        self.load = {d: sum(self.share(i) for i in ops) for d, ops in self.held.items()}

    def share(self, index: int, count: int | None = None) -> float:
        return self.erlangs[index] / max(1, self.count[index] if count is None else count)

    def neighbour(self, device: str, index: int) -> bool:
        ops = self.held[device]
        return index - 1 in ops or index + 1 in ops

    def add_many(self, index: int, k: int, strict: bool) -> list[str]:
        """Add up to `k` replicas of `index` on the best devices (see the module docstring);
        `strict`: only where the device stays under `MAX_UTIL`. Returns the devices.

        NOTE: one sort per operator, not one scan per replica: a device takes at most one
        replica of an operator, so the devices' order does not change between them."""
        share, need = self.share(index, self.count[index] + k), self.c.weight_bytes[index]
        draining = self.c.draining
        fits = [d for d in self.c.devices if index not in self.held[d]
                and ((index, d) in draining or self.room[d] >= need)
                and (not strict or self.load[d] + share <= MAX_UTIL)]
        # NOTE: a replica being removed first (keeping it costs no copy); then best fit:
        # devices in use before idle ones (those stay releasable), a neighbour's device
        # first, then the fullest that stays under the bound
        def rank(d: str) -> tuple[bool, bool, bool, bool, float, int]:
            return (self.load[d] + share > MAX_UTIL, (index, d) not in draining,
                    not self.held[d], not self.neighbour(d, index), -self.load[d], self.room[d])
        chosen = [min(fits, key=rank)] if k == 1 and fits else sorted(fits, key=rank)[:k]
        if chosen:
            self._recount(index, self.count[index] + len(chosen))
            for d in chosen:
                self.held[d].add(index)
                if (index, d) not in draining:
                    self.room[d] -= need
                self.load[d] += self.share(index)
        return chosen

    def _recount(self, index: int, count: int) -> None:
        delta = self.share(index, count) - self.share(index)
        for d, ops in self.held.items():
            if index in ops:
                self.load[d] += delta
        self.count[index] = count

    def add(self, index: int, device: str) -> None:
        self._recount(index, self.count[index] + 1)
        self.held[device].add(index)
        self.room[device] -= self.c.weight_bytes[index]
        self.load[device] += self.share(index)

    def discard(self, index: int, device: str) -> None:
        self.held[device].discard(index)
        self.room[device] += self.c.weight_bytes[index]
        self.load[device] -= self.share(index)
        self._recount(index, self.count[index] - 1)

    def hottest(self) -> str:
        return max(self.c.devices, key=lambda d: self.load[d])


def plan_opscale(loads: list[OpLoad], cluster: Cluster, slo_s: float,
                 keep: list[OpLoad] | None = None) -> ProvisionPlan:
    """Per-operator replica counts by queueing, placed by best fit (the module docstring),
    then more replicas of the busiest operators of any device predicted over `MAX_UTIL`
    (replicas of several operators share their device).

    `keep` is the demand over a longer window: replicas are removed only below what the
    larger of the two needs (bursty traffic falls silent between bursts)."""
    n = len(cluster.devices)
    up = targets(loads, slo_s, n)
    held = [max(x, y, key=lambda o: o.erlangs) for x, y in zip(loads, keep or loads, strict=True)]
    down = targets(held, slo_s, n, SCALE_DOWN_HEADROOM)
    layout = _Layout(cluster, held)
    removes = _removals(cluster, layout, down)
    adds: list[Change] = []
    for i in sorted(range(len(loads)), key=lambda i: -loads[i].erlangs):
        if layout.count[i] < up[i]:
            adds += [Change(i, d) for d in layout.add_many(i, up[i] - layout.count[i], False)]
    adds += _relieve(layout)
    undone = set(adds) & set(removes)  # NOTE: removed, then added back on the same device
    adds = [a for a in adds if a not in undone]
    removes = [r for r in removes if r not in undone]
    idle = tuple(d for d in cluster.devices if not layout.held[d])
    return ProvisionPlan(tuple(adds), tuple(removes), tuple(layout.count), idle)


def _relieve(layout: _Layout) -> list[Change]:
    """Replicas added one at a time until no device is predicted over `MAX_UTIL` (or none can
    help): for the hottest device, one more replica of its operator with the largest share
    (of those large enough to matter) that has a device to go to, kept under the bound
    there; then look again.

    NOTE: one at a time, not as many as one operator would need to relieve the device alone
    (a device that holds several operators is relieved by replicas of each; sizing by one
    placed that operator on every device of the cluster), nor a quarter more at once (fewer
    steps at 64 devices, but more device-seconds in a throwaway run of the provisioning
    bench)."""
    adds: list[Change] = []
    for _ in range(len(layout.c.devices) * len(layout.count)):
        hot = layout.hottest()
        excess = layout.load[hot] - MAX_UTIL
        if excess <= 0:
            break
        # NOTE: only operators whose share could plausibly relieve it, not replicas of
        # small ones everywhere
        useful = [i for i in layout.held[hot] if layout.share(i) >= excess / len(layout.held[hot])]
        for i in sorted(useful, key=lambda i: -layout.share(i)):
            placed = layout.add_many(i, 1, True)
            if placed:
                adds += [Change(i, d) for d in placed]
                break
        else:
            break
    return adds


def _removals(cluster: Cluster, layout: _Layout, want: list[int]) -> list[Change]:
    """Replicas above what `SCALE_DOWN_HEADROOM` more load would need, from the devices
    holding the fewest operators (so whole devices become idle), while every device they
    leave load on stays under `MAX_UTIL` with that headroom."""
    order = {d: k for k, d in enumerate(cluster.devices)}
    out: list[Change] = []
    for i in range(len(want)):
        spare = [d for d in cluster.devices if (i, d) in cluster.removable]
        # NOTE: among equals the last device first (the first keeps the replica it started)
        spare.sort(key=lambda d: (len(layout.held[d]), layout.load[d], -order[d]))
        for d in spare[:len(spare) - 1]:  # NOTE: one ready replica stays (others may load)
            if layout.count[i] <= max(1, want[i]):
                break
            layout.discard(i, d)
            if any(layout.load[x] * SCALE_DOWN_HEADROOM > MAX_UTIL
                   for x in cluster.devices if i in layout.held[x]):
                layout.add(i, d)  # NOTE: its device-mates would run too hot without it
                break
            out.append(Change(i, d))
    return out


def plan_model(pending_tokens_per_s: float, tokens_per_replica_s: float, cluster: Cluster,
               num_ops: int, util: float = MAX_UTIL) -> ProvisionPlan:
    """The model-level baseline: whole-model replicas, as many as the pending prompt tokens
    need at `util` of one replica's prefill throughput."""
    every = frozenset(range(num_ops))
    full = [d for d in cluster.devices if cluster.held.get(d, frozenset()) >= every]
    rate = pending_tokens_per_s / max(1e-9, tokens_per_replica_s * util)
    want = max(1, min(len(cluster.devices), math.ceil(rate)))
    adds: list[Change] = []
    if want > len(full):
        total = sum(cluster.weight_bytes)
        free = [d for d in cluster.devices if not cluster.held.get(d)
                and cluster.room_bytes.get(d, 0) >= total]
        for d in free[:want - len(full)]:
            adds += [Change(i, d) for i in range(num_ops)]
    removes: list[Change] = []
    if want < len(full):
        spare = [d for d in reversed(full)
                 if all((i, d) in cluster.removable for i in range(num_ops))]
        for d in spare[:len(full) - want]:
            removes += [Change(i, d) for i in range(num_ops)]
    gone = {c.device for c in removes}
    held = {c.device for c in adds} | {d for d, ops in cluster.held.items() if ops}
    idle = tuple(d for d in cluster.devices if d not in held or d in gone)
    return ProvisionPlan(tuple(adds), tuple(removes), (len(full) + len(adds) // num_ops
                                                       - len(gone),) * num_ops, idle)
