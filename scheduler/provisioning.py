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
actuates them is `scheduler/provisioner.py`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from scheduler.queueing import replicas_for
from scheduler.replicas import Change

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
    """A plan's working copy of who holds what, with predicted utilisation per device."""

    def __init__(self, cluster: Cluster, loads: list[OpLoad], counts: list[int]) -> None:
        self.c = cluster
        self.share = [x.erlangs / max(1, n) for x, n in zip(loads, counts, strict=True)]
        self.held = {d: set(cluster.held.get(d, ())) for d in cluster.devices}
        self.room = dict(cluster.room_bytes)
        self.load = {d: sum(self.share[i] for i in ops) for d, ops in self.held.items()}

    def neighbour(self, device: str, index: int) -> bool:
        ops = self.held[device]
        return index - 1 in ops or index + 1 in ops

    def best_for(self, index: int) -> str | None:
        """Where to add a replica of `index` (see the module docstring), or None."""
        share, need = self.share[index], self.c.weight_bytes[index]
        best, best_key = None, None
        for d in self.c.devices:
            if index in self.held[d] or self.room[d] < need:
                continue
            key = (self.load[d] + share > MAX_UTIL, not self.neighbour(d, index),
                   not self.held[d], self.load[d], self.room[d])
            if best_key is None or key < best_key:
                best, best_key = d, key
        return best

    def add(self, index: int, device: str) -> None:
        self.held[device].add(index)
        self.room[device] -= self.c.weight_bytes[index]
        self.load[device] += self.share[index]

    def discard(self, index: int, device: str) -> None:
        self.held[device].discard(index)
        self.load[device] -= self.share[index]


def plan_opscale(loads: list[OpLoad], cluster: Cluster, slo_s: float) -> ProvisionPlan:
    """Per-operator replica counts by queueing, placed by best fit (the module docstring)."""
    n = len(cluster.devices)
    up = targets(loads, slo_s, n)
    down = targets(loads, slo_s, n, SCALE_DOWN_HEADROOM)
    counts = [cluster.count(i) for i in range(len(loads))]
    final = [max(u, c) if c <= d else d for u, d, c in zip(up, down, counts, strict=True)]
    layout = _Layout(cluster, loads, final)
    adds: list[Change] = []
    for i in sorted(range(len(loads)), key=lambda i: -loads[i].erlangs):
        for _ in range(final[i] - counts[i]):
            device = layout.best_for(i)
            if device is None:
                final[i] = counts[i] + sum(a.index == i for a in adds)
                break
            layout.add(i, device)
            adds.append(Change(i, device))
    removes = _removals(cluster, layout, counts, final)
    for r in removes:
        layout.discard(r.index, r.device)
    idle = tuple(d for d in cluster.devices if not layout.held[d])
    return ProvisionPlan(tuple(adds), tuple(removes), tuple(final), idle)


def _removals(cluster: Cluster, layout: _Layout, counts: list[int], final: list[int]
              ) -> list[Change]:
    out: list[Change] = []
    for i, (have, want) in enumerate(zip(counts, final, strict=True)):
        spare = [d for d in cluster.devices if (i, d) in cluster.removable]
        # NOTE: devices holding the fewest operators first, so whole devices become idle;
        # among equals the last device first (the first keeps the replica it started with)
        order = {d: k for k, d in enumerate(cluster.devices)}
        spare.sort(key=lambda d: (len(layout.held[d]), layout.load[d], -order[d]))
        for d in spare[:max(0, have - max(1, want))]:
            out.append(Change(i, d))
    return out


def plan_model(pending_tokens_per_s: float, tokens_per_replica_s: float, cluster: Cluster,
               num_ops: int) -> ProvisionPlan:
    """The model-level baseline: whole-model replicas, as many as the pending prompt tokens
    need at `MAX_UTIL` of one replica's prefill throughput."""
    every = frozenset(range(num_ops))
    full = [d for d in cluster.devices if cluster.held.get(d, frozenset()) >= every]
    rate = pending_tokens_per_s / max(1e-9, tokens_per_replica_s * MAX_UTIL)
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
