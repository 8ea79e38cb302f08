"""`InFlight`: the classes of the decode steps in flight, per placement."""

from __future__ import annotations

import dataclasses

from executors.types import Priority
from scheduler.round.inflight import InFlight
from scheduler.round.plan import Feed, Plan
from tests.scheduler.views import make_view, req, single


def _step(priority: Priority, *rids: str) -> Plan:
    on0 = single("cpu:0")
    feeds = [Feed(req(rid, priority, prompt=8, computed=8, output=1, placement=on0), 8, 1)
             for rid in rids]
    return Plan(priority, on0, [feeds])


def test_decode_classes_count_each_step_in_flight_until_it_ends() -> None:
    on0 = single("cpu:0")
    flight = InFlight()
    low, low2, high = _step(Priority.LOW, "a", "b"), _step(Priority.LOW, "c"), \
        _step(Priority.HIGH, "d")
    for plan in (low, low2, high):
        flight.add(plan)
    assert set(flight.decode_classes) == {(on0, Priority.LOW), (on0, Priority.HIGH)}
    flight.remove(high)
    assert set(flight.decode_classes) == {(on0, Priority.LOW)}
    flight.remove(low)  # one low step is still in flight
    assert set(flight.decode_classes) == {(on0, Priority.LOW)}
    flight.remove(low2)
    assert not flight.decode_classes


def test_step_ends_name_the_last_op_in_flight_of_each_paced_request() -> None:
    flight = InFlight()
    plan = make_view().builder.build(_step(Priority.LOW, "a", "b"))
    flight.add(plan)
    a, b = (req(rid, prompt=8, computed=8, output=1, placement=single("cpu:0"))
            for rid in ("a", "b"))
    paced = dataclasses.replace(a, tpot_slo_s=0.05)
    idle = dataclasses.replace(req("c", prompt=8, computed=8, output=1), tpot_slo_s=0.05)
    assert flight.step_ends((paced, b, idle)) == {"a": plan.finals[-1].op_id}
    flight.remove(plan)
    assert flight.step_ends((paced,)) == {}
