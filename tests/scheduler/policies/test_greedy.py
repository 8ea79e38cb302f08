"""The baselines' decisions on hand-built views: order, packing, preemption, partitions."""

from __future__ import annotations

from executors.types import Priority
from scheduler.policies import make_policy
from tests.scheduler.views import make_view, req, single


def test_fcfs_admits_in_arrival_order_whatever_the_class() -> None:
    rs = [req("low", Priority.LOW, arrival=0.0), req("high", Priority.HIGH, arrival=1.0)]
    d = make_policy("fcfs").schedule(make_view(waiting=rs))
    assert [a.rid for a in d.admissions] == ["low", "high"]
    assert all(p.priority is Priority.NORMAL for p in d.plans)  # fcfs ignores classes


def test_priority_admits_the_high_class_first() -> None:
    rs = [req("low", Priority.LOW, arrival=0.0), req("high", Priority.HIGH, arrival=1.0)]
    d = make_policy("priority").schedule(make_view(waiting=rs, free_blocks=3))
    assert [a.rid for a in d.admissions] == ["high", "low"]
    assert [(p.placement[0], p.priority) for p in d.plans] == [("cpu:0", Priority.HIGH),
                                                              ("cpu:1", Priority.LOW)]


def test_priority_preempts_low_kv_and_never_plans_the_victim() -> None:
    # the victim's prompt is still to prefill: it is packed into cpu:0's plan before the
    # urgent request takes its KV, and must leave that plan
    victim = req("v", Priority.LOW, prompt=70, placement=single("cpu:0"), blocks=5)
    hp = req("hp", Priority.HIGH, prompt=60, max_tokens=20)  # 5 blocks
    view = make_view(waiting=[hp], runnable=[victim], free_blocks=0)
    d = make_policy("priority").schedule(view)
    assert [p.rid for p in d.preemptions] == ["v"]
    assert [a.rid for a in d.admissions] == ["hp"]
    assert all("v" not in p.rids for p in d.plans)  # no plan for a request just preempted
    assert any("hp" in p.rids for p in d.plans)


def test_static_keeps_classes_on_their_own_devices() -> None:
    rs = [req("low", Priority.LOW), req("high", Priority.HIGH, arrival=1.0)]
    d = make_policy("static").schedule(make_view(waiting=rs))
    where = {a.rid: a.placement[0] for a in d.admissions}
    assert where == {"high": "cpu:0", "low": "cpu:1"}


def test_one_prefill_plan_per_device_packed_within_the_budget() -> None:
    rs = [req(f"r{i}", Priority.LOW, prompt=200, arrival=float(i)) for i in range(6)]
    d = make_policy("fcfs").schedule(make_view(waiting=rs))
    assert len(d.plans) == 2
    for p in d.plans:
        assert p.num_tokens() <= 512 and len(p.chunks) == 1
