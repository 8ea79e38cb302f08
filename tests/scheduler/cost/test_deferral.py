"""The re-profile deferral: a pure decision, and a gate that remembers interactive work."""

from __future__ import annotations

import math

import pytest

from scheduler.cost.deferral import (
    QUIET_S,
    ReprofileGate,
    ServingLoad,
    defer_reason,
    may_reprofile,
)

IDLE = ServingLoad()


@pytest.mark.parametrize(("load", "since_s", "expected"), [
    (IDLE, math.inf, True),  # nothing served, ever
    (IDLE, QUIET_S, True),  # quiet long enough
    (IDLE, QUIET_S / 2, False),  # interactive work moments ago: its next request may follow
    (ServingLoad(interactive_waiting=1), math.inf, False),
    (ServingLoad(interactive_running=1), math.inf, False),
])
def test_may_reprofile(load: ServingLoad, since_s: float, expected: bool) -> None:
    assert may_reprofile(load, since_s) is expected


def test_the_reason_names_the_interactive_work() -> None:
    assert defer_reason(ServingLoad(2, 1)) == "2 interactive request(s) waiting, 1 running"
    assert defer_reason(IDLE) == "interactive work ended moments ago"


def test_the_gate_holds_while_interactive_work_lasts_then_a_quiet_period() -> None:
    gate = ReprofileGate(quiet_s=1.0)
    assert gate.check(IDLE, 0.0)  # never saw any: open at once
    busy = ServingLoad(interactive_running=1)
    assert not gate.check(busy, 10.0)
    assert not gate.check(busy, 12.0)
    assert not gate.check(IDLE, 12.5)  # ended at 12: quiet until 13
    assert gate.held_s(12.5) == pytest.approx(2.5)  # closed since 10
    assert gate.check(IDLE, 13.0)
    assert gate.deferred_s == pytest.approx(3.0)  # closed from 10 to 13
    gate.reset()
    assert gate.deferred_s == 0.0
