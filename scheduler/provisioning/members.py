"""OpScale for a model set (models/modelset.py): each member's replicas planned apart.

Each member model gets its own `plan_opscale` over its own chain: its queueing
model from its own operators' arrivals and estimated times, a cluster of only
the devices it runs on, and the room each device has for it (free memory plus
the free blocks of that member's KV pool there). Members are planned busiest
first, and the bytes one member's replicas take on a device are taken off the
room the next ones see, so every model's weights and KV share one budget.

NOTE: a request of a model set runs on one device (`RoundView.may_place`: its
KV lives in that device's pool of its model), so a member's replicas are
useful only as whole chains: a device that a member's plan gives any replica
gets the rest of that member's chain too (or none of it, when the rest does not
fit), and a member's replicas leave a device only all together. The operator
counts still come from the queueing model (the busiest operator's count sets
the number of devices holding the chain); what is left is splitting a
member's request across devices, as one model's requests may be split.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass

from scheduler.memory.replicas import Change
from scheduler.provisioning.planning import Cluster, OpLoad, ProvisionPlan, plan_opscale


@dataclass(frozen=True, slots=True)
class MemberLoad:
    """One member's part of a plan: its chain in the set, its cluster (its devices; operator
    indices counted from its chain's first) and its operators' demand."""

    chain: range  # its operators' indices in the set's chain
    cluster: Cluster
    loads: list[OpLoad]  # over the short window, per operator of its chain
    keep: list[OpLoad]  # over the long window (removals)

    def __post_init__(self) -> None:
        if not len(self.chain) == len(self.loads) == len(self.keep) \
                == len(self.cluster.weight_bytes):
            raise ValueError("a member's chain, loads and weights must have one entry an op")

    @property
    def erlangs(self) -> float:
        return sum(x.erlangs for x in self.loads)


def plan_members(members: list[MemberLoad], slo_s: float, devices: tuple[str, ...]
                 ) -> ProvisionPlan:
    """One plan for every member (the module docstring), in the set's operator indices."""
    num_ops = max(m.chain.stop for m in members)
    taken: dict[str, int] = defaultdict(int)  # device -> bytes earlier members' adds take
    adds: list[Change] = []
    removes: list[Change] = []
    target = [0] * num_ops
    busy: set[str] = set()  # devices some member holds something on after the plan
    for m in sorted(members, key=lambda m: -m.erlangs):
        room = {d: r - taken[d] for d, r in m.cluster.room_bytes.items()}
        cluster = dataclasses.replace(m.cluster, room_bytes=room)
        local = whole_chains(plan_opscale(m.loads, cluster, slo_s, m.keep), cluster)
        for c in local.adds:
            if (c.index, c.device) not in cluster.draining:
                taken[c.device] += cluster.weight_bytes[c.index]
        first = m.chain.start
        adds += [Change(first + c.index, c.device) for c in local.adds]
        removes += [Change(first + c.index, c.device) for c in local.removes]
        target[m.chain.start:m.chain.stop] = local.target
        busy |= set(cluster.devices) - set(local.idle)
    idle = tuple(d for d in devices if d not in busy)
    return ProvisionPlan(tuple(adds), tuple(removes), tuple(target), idle)


def whole_chains(plan: ProvisionPlan, cluster: Cluster) -> ProvisionPlan:
    """`plan` (of one member) made of whole chains: each device it adds to gets the rest of
    the chain, or nothing when the rest does not fit in its room; removals stay only on
    devices they leave holding none of the chain."""
    every = range(len(cluster.weight_bytes))
    adds: list[Change] = []
    for d in dict.fromkeys(c.device for c in plan.adds):
        held = cluster.held.get(d, frozenset())
        missing = [i for i in every if i not in held]
        need = sum(cluster.weight_bytes[i] for i in missing if (i, d) not in cluster.draining)
        if need <= cluster.room_bytes.get(d, 0):
            adds += [Change(i, d) for i in missing]
    gone: dict[str, set[int]] = defaultdict(set)
    for c in plan.removes:
        gone[c.device].add(c.index)
    removes = [c for c in plan.removes if gone[c.device] >= cluster.held.get(c.device, set())]
    target = [cluster.count(i) + sum(c.index == i for c in adds)
              - sum(c.index == i for c in removes) for i in every]
    added = {c.device for c in adds}
    emptied = {c.device for c in removes}
    idle = tuple(d for d in cluster.devices if d not in added
                 and (not cluster.held.get(d) or d in emptied))
    return ProvisionPlan(tuple(adds), tuple(removes), tuple(target), idle)
