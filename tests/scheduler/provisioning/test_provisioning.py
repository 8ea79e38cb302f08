import math

import pytest

from executors.types import Priority
from scheduler.config import SchedulerConfig
from scheduler.memory.replicas import Change, ReplicaState
from scheduler.provisioning.planning import (
    Cluster,
    OpLoad,
    ProvisionPlan,
    plan_model,
    plan_opscale,
    targets,
    wait_budgets,
)
from scheduler.provisioning.provisioner import keeps_deadlines
from scheduler.provisioning.queueing import mean_wait_s
from scheduler.sim.gmg import DeviceView, SimOp, Snapshot
from tests.scheduler.cluster import ClusterRun

DEVS = tuple(f"d{i}" for i in range(6))
W = (100, 400, 400, 400, 100)  # weight bytes of embed, three groups, head


def cluster(held: dict[str, set[int]], room: int = 10_000) -> Cluster:
    full = {d: frozenset(held.get(d, ())) for d in DEVS}
    removable = frozenset((i, d) for d, ops in full.items() for i in ops
                          if sum(i in o for o in full.values()) > 1)
    return Cluster(DEVS, full, removable, dict.fromkeys(DEVS, room), W)


def one_replica() -> dict[str, set[int]]:
    return {"d0": set(range(5))}


def loads(busy: float) -> list[OpLoad]:
    """Group 2 is the bottleneck: `busy` Erlangs; the rest are light."""
    return [OpLoad(100.0, 0.0005), OpLoad(100.0, 0.001), OpLoad(100.0, busy / 100),
            OpLoad(100.0, 0.001), OpLoad(100.0, 0.0005)]


def test_wait_budgets_split_the_slack_by_service_time() -> None:
    b = wait_budgets([OpLoad(1, 0.1), OpLoad(1, 0.3)], 1.0)
    assert b == pytest.approx([0.15, 0.45])
    assert wait_budgets([OpLoad(1, 0.7), OpLoad(1, 0.7)], 1.0) == [0.0, 0.0]


def test_targets_keep_each_operator_within_its_share() -> None:
    ls = loads(2.5)
    ts = targets(ls, 0.5, 6)
    for x, b, c in zip(ls, wait_budgets(ls, 0.5), ts, strict=True):
        assert mean_wait_s(c, x.arrivals_per_s, x.service_s) <= b
        assert c == 1 or mean_wait_s(c - 1, x.arrivals_per_s, x.service_s) > b
    assert ts[2] >= 3 and ts[0] == 1  # only the bottleneck is replicated


def test_opscale_replicates_only_the_bottleneck_beside_its_neighbours() -> None:
    base = one_replica()
    base["d1"] = {1}  # d1 already holds the group before the bottleneck
    plan = plan_opscale(loads(1.5), cluster(base), 0.5)
    assert plan.adds and all(a.index == 2 for a in plan.adds)
    assert plan.adds[0].device == "d1"  # the neighbour first: fewer transfers
    assert not plan.removes  # d1's group 1 keeps d0 under its bound
    assert set(plan.idle) == set(DEVS) - {"d0", *(a.device for a in plan.adds)}


def test_opscale_removes_spare_replicas_emptying_devices() -> None:
    held = one_replica()
    for d in ("d1", "d2", "d3"):
        held[d] = {2}
    plan = plan_opscale(loads(0.1), cluster(held), 0.5)
    assert sorted(r.device for r in plan.removes) == ["d1", "d2", "d3"]
    assert set(plan.idle) == set(DEVS) - {"d0"}


def applied(c: Cluster, plan: ProvisionPlan) -> Cluster:
    held = {d: set(ops) for d, ops in c.held.items()}
    for a in plan.adds:
        held[a.device].add(a.index)
    for r in plan.removes:
        held[r.device].discard(r.index)
    return cluster(held)


def test_opscale_plans_reach_a_fixed_point_and_do_not_flap() -> None:
    ls = loads(2.5)
    c = applied(cluster(one_replica()), plan_opscale(ls, cluster(one_replica()), 0.5))
    assert plan_opscale(ls, c, 0.5).empty
    lighter = loads(2.5 / 1.1)  # a little less load: still needed with 25% headroom
    assert not plan_opscale(lighter, c, 0.5).removes
    assert plan_opscale(loads(0.1), c, 0.5).removes  # much less: removed


def test_opscale_keeps_devices_under_their_bound() -> None:
    ls = loads(2.5)
    plan = plan_opscale(ls, cluster(one_replica()), 0.5)
    c = applied(cluster(one_replica()), plan)
    for d, ops in c.held.items():
        assert sum(ls[i].erlangs / c.count(i) for i in ops) <= 0.9 + 1e-9, d


def test_opscale_relieves_a_device_holding_every_operator_with_a_few_devices() -> None:
    ls = [OpLoad(100.0, 0.003)] * 5  # 0.3 Erlangs each: 1.5 on d0, which holds them all
    plan = plan_opscale(ls, cluster(one_replica()), 60.0)
    c = applied(cluster(one_replica()), plan)
    used = [d for d, ops in c.held.items() if ops]
    for d in used:
        assert sum(ls[i].erlangs / c.count(i) for i in c.held[d]) <= 0.9 + 1e-9, d
    assert len(used) == 2  # 1.5 Erlangs fit on two devices, not one replica on each of six
    assert set(plan.idle) == set(DEVS) - set(used)


def test_opscale_uses_the_longer_window_before_removing() -> None:
    held = one_replica()
    for d in ("d1", "d2", "d3"):
        held[d] = {2}
    assert not plan_opscale(loads(0.1), cluster(held), 0.5, keep=loads(2.5)).removes


def test_opscale_adds_only_where_the_weights_fit() -> None:
    plan = plan_opscale(loads(2.5), cluster(one_replica(), room=300), 0.5)
    assert plan.empty and plan.target[2] == 1


def test_model_baseline_adds_and_removes_whole_replicas() -> None:
    up = plan_model(pending_tokens_per_s=2500, tokens_per_replica_s=1000,
                    cluster=cluster(one_replica()), num_ops=5)
    assert sorted({a.device for a in up.adds}) == ["d1", "d2"]
    assert all(sum(a.device == d for a in up.adds) == 5 for d in ("d1", "d2"))
    held = {d: set(range(5)) for d in ("d0", "d1", "d2")}
    down = plan_model(100, 1000, cluster(held), 5)
    assert {r.device for r in down.removes} == {"d1", "d2"} and len(down.removes) == 10


def snapshot(deadline: float, capacity: int = 1 << 30) -> Snapshot:
    """r1's prefill: op 1 on d0 (running until 0.01), then op 2 on d1 makes its token."""
    ops = (SimOp(1, "layers[0:2]", "d0", Priority.HIGH, (), 0.01, 0.0, 0.0, 0),
           SimOp(2, "head", "d1", Priority.HIGH, (1,), 0.01, 0.0, None, 0, ("r1",)))
    devs = (DeviceView("d0", capacity, 0), DeviceView("d1", capacity, 0))
    return Snapshot(0.0, ops, devs, (("r1", deadline),))


def copy(est_s: float, nbytes: int = 0) -> SimOp:
    return SimOp(-1, "load 2", "d1", Priority.HIGH, (), est_s, 0.0, None, nbytes, (), 0.0)


def test_a_plan_whose_copy_makes_a_deadline_miss_is_rejected() -> None:
    snap = snapshot(deadline=0.05)
    assert keeps_deadlines(snap, [copy(0.001)])
    # the copy starts on the idle d1 before r1's head is ready and holds it until 0.1
    assert not keeps_deadlines(snap, [copy(0.1)])


def test_a_plan_that_misses_no_new_deadline_is_accepted() -> None:
    assert keeps_deadlines(snapshot(deadline=0.005), [copy(0.1)])  # missed either way


def test_a_plan_out_of_memory_is_rejected() -> None:
    assert not keeps_deadlines(snapshot(math.inf, capacity=1000), [copy(0.001, 2000)])


async def test_provisioner_adds_under_load_and_removes_when_it_drops() -> None:
    cfg = SchedulerConfig(policy="slice", max_model_len=1024, max_batch_tokens=512,
                          provisioning="opscale", provision_interval_s=3600)
    async with ClusterRun("slice", devices=3, cfg=cfg) as run:
        sched = run.sched
        prov = sched.provisioner
        assert prov is not None
        outs = []
        for k in range(40):
            outs.append(run.submit(f"r{k}", Priority.HIGH, 300, max_tokens=4, slo_s=0.05))
            await run.run_until(0.002 * (k + 1))
        plan = prov.tick(sched.clock())
        assert plan is not None and plan.adds and prov.plan_ms
        await run.run_until(sched.clock() + 0.001)
        added = {(a.index, a.device) for a in plan.adds}
        assert all(sched.replicas.state(i, d) is ReplicaState.READY for i, d in added)
        await run.run_out()
        run.cluster.run_until(sched.clock() + sched.demand.keep_window_s + 1)  # load gone
        down = prov.tick(sched.clock())
        assert down is not None and {(c.index, c.device) for c in down.removes} == added
        assert sched.replicas.draining() == [] and len(sched.replicas.idle_devices(
            sched.devices)) == 2
    assert all(o.finish is not None and len(o.tokens) == 4 for o in outs)
    assert Change(0, "cpu:0") not in down.removes
