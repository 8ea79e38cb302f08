"""OpScale with several models: each member's replicas sized from its own demand and placed
on its own devices, as whole chains, within one memory budget per device."""

from __future__ import annotations

import pytest

from executors.types import OpRole, Priority
from models.modelset import ModelSet, model_set
from scheduler.config import SchedulerConfig
from scheduler.memory.replicas import Change, ReplicaState
from scheduler.provisioning.members import MemberLoad, plan_members, whole_chains
from scheduler.provisioning.planning import Cluster, OpLoad, ProvisionPlan
from tests.scheduler.cluster import ClusterRun, weightless

W = (100, 400, 400, 100)  # one member's chain: embed, two groups, head


def member(first: int, devices: tuple[str, ...], busy: float, room: int = 10_000,
           held: dict[str, set[int]] | None = None) -> MemberLoad:
    held = held or {devices[0]: set(range(len(W)))}
    full = {d: frozenset(held.get(d, ())) for d in devices}
    removable = frozenset((i, d) for d, ops in full.items() for i in ops
                          if sum(i in o for o in full.values()) > 1)
    cluster = Cluster(devices, full, removable, dict.fromkeys(devices, room), W)
    loads = [OpLoad(100.0, 0.0005), OpLoad(100.0, busy / 100), OpLoad(100.0, 0.001),
             OpLoad(100.0, 0.0005)]
    return MemberLoad(range(first, first + len(W)), cluster, loads, loads)


def test_only_the_busy_member_gets_replicas_on_its_own_devices() -> None:
    chat = member(0, ("d0", "d1"), busy=0.05)
    batch = member(4, ("d2", "d3", "d4"), busy=1.8)
    plan = plan_members([chat, batch], 0.5, ("d0", "d1", "d2", "d3", "d4"))
    assert plan.adds and {a.device for a in plan.adds} <= {"d3", "d4"}
    for device in {a.device for a in plan.adds}:  # whole chains of batch (ops 4..7 of the set)
        assert {a.index for a in plan.adds if a.device == device} == set(range(4, 8))
    assert plan.target[:4] == (1, 1, 1, 1) and min(plan.target[4:]) >= 2
    assert not plan.removes and "d1" in plan.idle and "d0" not in plan.idle


def test_one_members_replicas_take_room_the_next_member_sees() -> None:
    # d2 is shared: a's replicas fill it, so b's busy chain finds no room left there
    a = member(0, ("d0", "d2"), busy=1.8, room=1000)
    b = member(4, ("d1", "d2"), busy=1.5, room=1000)
    plan = plan_members([b, a], 0.5, ("d0", "d1", "d2"))
    assert {a.device for a in plan.adds} == {"d2"}
    assert {a.index for a in plan.adds} == set(range(4))  # a is busier: planned first


def test_a_member_plan_becomes_whole_chains() -> None:
    cluster = member(0, ("d0", "d1", "d2"), busy=0.1,
                     held={"d0": {0, 1, 2, 3}, "d1": {0, 1, 2, 3}, "d2": {1}}).cluster
    partial = ProvisionPlan((Change(1, "d1"),), (Change(0, "d1"), Change(1, "d2")),
                            (2, 3, 1, 2), ())
    whole = whole_chains(partial, cluster)
    assert whole.adds == ()  # d1 holds the chain already
    assert whole.removes == (Change(1, "d2"),)  # d1 keeps its chain: its one removal is undone
    assert whole.idle == ("d2",)
    cramped = member(0, ("d0", "d1"), busy=0.1, room=500).cluster
    assert whole_chains(ProvisionPlan((Change(1, "d1"),), (), (1, 2, 1, 1), ()),
                        cramped).adds == ()  # the rest of the chain does not fit on d1


def two_models() -> ModelSet:
    return model_set([("chat", weightless(), ("cpu:0", "cpu:1")),
                      ("batch", weightless(), ("cpu:2", "cpu:3"))])


async def test_the_provisioner_replicates_the_busy_model_on_its_devices_only() -> None:
    cfg = SchedulerConfig(policy="slice", max_model_len=1024, max_batch_tokens=512,
                          provisioning="opscale", provision_interval_s=3600)
    async with ClusterRun("slice", devices=4, model=two_models(), cfg=cfg) as run:
        sched, prov = run.sched, run.sched.provisioner
        assert prov is not None
        assert {d: sched.replicas.resident(d) for d in sched.devices} == {
            "cpu:0": [0, 1, 2, 3, 4, 5], "cpu:1": [], "cpu:2": [6, 7, 8, 9, 10, 11],
            "cpu:3": []}  # each model's chain on its first device
        outs = [run.submit("c", Priority.HIGH, 20, max_tokens=2, slo_s=0.5, model="chat")]
        for k in range(40):
            outs.append(run.submit(f"b{k}", Priority.HIGH, 300, max_tokens=4, slo_s=0.05,
                                   model="batch"))
            await run.run_until(0.002 * (k + 1))
        plan = prov.tick(sched.clock())
        assert plan is not None
        assert {(a.index, a.device) for a in plan.adds} == {(i, "cpu:3") for i in range(6, 12)}
        await run.run_until(sched.clock() + 0.001)
        assert all(sched.replicas.state(i, "cpu:3") is ReplicaState.READY for i in range(6, 12))
        assert sched.snapshot()["devices"][3]["replicas"][0] == {"op": "batch/embed",
                                                                 "state": "ready"}
        late = len(run.ops)
        outs += [run.submit(f"l{k}", Priority.HIGH, 300, max_tokens=4, slo_s=0.05,
                            model="batch") for k in range(8)]
        await run.run_out()
    assert all(o.finish is not None and o.error is None and o.tokens for o in outs)
    ran = {op.device for op in run.ops[late:] if op.role is OpRole.COMPUTE}
    assert "cpu:3" in ran and not ran & {"cpu:0", "cpu:1"}
    assert {op.device for op in run.ops if op.name.startswith("chat/")} == {"cpu:0"}


@pytest.mark.parametrize("policy", ["fcfs", "priority", "static", "slice"])
async def test_every_policy_runs_each_model_where_its_chain_is(policy: str) -> None:
    cfg = SchedulerConfig(policy=policy, max_model_len=1024, max_batch_tokens=512,
                          provisioning="opscale", provision_interval_s=3600)
    async with ClusterRun(policy, devices=4, model=two_models(), cfg=cfg) as run:
        outs = [run.submit(f"c{i}", Priority.HIGH, 30, 3, slo_s=0.5, model="chat")
                for i in range(2)]
        outs += [run.submit(f"b{i}", Priority.LOW, 100, 3, model="batch") for i in range(3)]
        await run.run_out()
    assert all(len(o.tokens) == 3 and o.error is None for o in outs)
    devices = {name: {op.device for op in run.ops if op.role is OpRole.COMPUTE
                      and op.name.startswith(f"{name}/")} for name in ("chat", "batch")}
    assert devices == {"chat": {"cpu:0"}, "batch": {"cpu:2"}}  # no replica elsewhere yet
