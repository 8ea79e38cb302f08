from __future__ import annotations

import logging

import pytest

from executors.interference import OP_CLASSES, Interference
from executors.types import Priority
from scheduler.round.calibration import (
    FACTOR_RANGE,
    MAX_PENDING,
    ONE_DEVICE,
    PIPELINE,
    SPLIT,
    WIDE,
    FirstTokenCalibration,
    kind_of,
)
from scheduler.round.plan import Feed, Plan
from tests.scheduler.cluster import ClusterRun
from tests.scheduler.views import req


def _plan(rid: str, placement: tuple[str, ...], predicted: float | None,
          chunks: int = 1) -> Plan:
    r = req(rid, Priority.HIGH, prompt=40)
    plan = Plan(Priority.HIGH, placement, [[Feed(r, 0, 40)] for _ in range(chunks)])
    plan.predicted_first_token_s = predicted
    return plan


def test_kinds_of_placement() -> None:
    assert kind_of(("a", "a", "a"), 1) == ONE_DEVICE
    assert kind_of(("a", "a", "a"), 3) == ONE_DEVICE
    assert kind_of(("a", "b", "b"), 1) == SPLIT
    assert kind_of(("a", "b", "b"), 2) == PIPELINE
    assert kind_of(("a", "a", "a"), 1, wide=True) == WIDE


def test_a_wide_plan_is_scored_apart_from_one_device_plans() -> None:
    cal = FirstTokenCalibration(min_samples=1)
    wide = _plan("w", ("a", "a", "a"), 0.1)
    wide.wide = "b"
    cal.issued(wide, 0.0)
    cal.first_token("w", 0.2)
    assert cal.factors() == {WIDE: 2.0}


def test_the_factor_is_the_median_ratio_once_enough_plans_ended(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="scheduler.round.calibration")
    cal = FirstTokenCalibration(window=5, min_samples=3)
    two = ("cpu:0", "cpu:1")
    for i, measured in enumerate([0.2, 0.15, 0.3]):  # predicted 0.1 each
        cal.issued(_plan(f"r{i}", two, 10.0 * i + 0.1), 10.0 * i)
        assert cal.factors() == {}  # too few yet
        cal.first_token(f"r{i}", 10.0 * i + measured)
    assert cal.factors() == {SPLIT: pytest.approx(2.0)}
    seen = cal.factors()  # as a round's view holds it
    for i in range(3, 8):  # the window forgets the first ones
        cal.issued(_plan(f"r{i}", two, 10.0 * i + 0.1), 10.0 * i)
        cal.first_token(f"r{i}", 10.0 * i + 0.1)
    assert cal.factors() == {SPLIT: pytest.approx(1.0)}
    assert seen == {SPLIT: pytest.approx(2.0)}  # a view's factors never change under it
    logged = [r.getMessage() for r in caplog.records]
    assert logged[0].startswith("first tokens of split plans take 2.00x")
    assert logged[-1].startswith("first tokens of split plans take 1.00x")


def test_factors_are_clamped_and_void_predictions_are_not_scored() -> None:
    cal = FirstTokenCalibration(window=8, min_samples=1)
    one = ("cpu:0",)
    cal.issued(_plan("stall", one, 0.1), 0.0)
    cal.first_token("stall", 100.0)  # a stall of 1000x
    assert cal.factors() == {ONE_DEVICE: FACTOR_RANGE[1]}
    cal.issued(_plan("none", one, None), 0.0)  # no prediction
    cal.issued(_plan("now", one, 0.001), 0.0)  # too short a wait to score
    cal.issued(_plan("gone", one, 0.1), 0.0)
    cal.forget("gone")  # ended before its first token
    for rid in ("none", "now", "gone", "unknown"):
        cal.first_token(rid, 5.0)
    assert cal.samples()[ONE_DEVICE] == 1


def test_pending_predictions_are_bounded() -> None:
    cal = FirstTokenCalibration(min_samples=1)
    for i in range(MAX_PENDING + 10):
        cal.issued(_plan(f"r{i}", ("cpu:0",), 0.1), 0.0)
    cal.first_token("r0", 0.2)  # dropped as the oldest
    cal.first_token(f"r{MAX_PENDING + 9}", 0.2)
    assert cal.samples()[ONE_DEVICE] == 1


async def test_plans_that_run_slower_than_predicted_lose_their_placement() -> None:
    """Two devices on one host slow each other 3x, which the cost model does not know:
    long prompts first go to a chunked pipeline over both (predicted first), which runs
    far over its prediction; once enough of those ended, they go to one device."""
    shared = Interference(dict.fromkeys(("cpu:0", "cpu:1"), "host"),
                          {(a, b): 3.0 for a in OP_CLASSES for b in OP_CLASSES})
    async with ClusterRun("slice", interference=shared) as run:
        devices = []
        for i in range(8):
            prompt = [100 + i] + [3 + j % 50 for j in range(479)]  # no prefix shared
            out = run.submit(f"r{i}", Priority.HIGH, 480, max_tokens=1, prompt=prompt)
            await run.run_out()
            assert out.error is None
            devices.append({op.device for op in run.ops if op.request_ids == (f"r{i}",)})
        factors = run.sched.calibration.factors()
    assert devices[0] == {"cpu:0", "cpu:1"}  # predicted first
    assert len(devices[-1]) == 1  # measured first
    assert factors[PIPELINE] > 1.5
    assert factors.get(ONE_DEVICE, 1.0) == pytest.approx(1.0, abs=0.1)
