from __future__ import annotations

import dataclasses

import pytest

from executors.types import Priority
from scheduler.policies.scoring import decode_delay, expected
from scheduler.round.calibration import ONE_DEVICE, PIPELINE
from scheduler.round.draft import Draft
from scheduler.round.plan import Feed, Plan
from tests.scheduler.views import make_view, req, single


def _prefill(draft: Draft, device: str) -> Plan:
    hp = req("hp", Priority.HIGH, prompt=40)
    return draft.view.builder.build(Plan(Priority.HIGH, single(device), [[Feed(hp, 0, 40)]]))


def test_expected_scales_the_wait_not_the_clock() -> None:
    view = make_view(now=10.0)
    plan = _prefill(Draft(view), "cpu:0")
    assert expected(Draft(view), plan, 10.1) == pytest.approx(10.1)
    scaled = dataclasses.replace(view, first_token_factors={ONE_DEVICE: 1.5, PIPELINE: 3.0})
    assert expected(Draft(scaled), plan, 10.1) == pytest.approx(10.15)


def test_decode_delay_counts_requests_decoding_on_the_plans_devices_at_its_class() -> None:
    on0 = single("cpu:0")
    decs = [req(f"d{i}", Priority.HIGH, prompt=20, computed=20, output=1, placement=on0,
                blocks=2) for i in range(2)]
    low = req("low", Priority.LOW, prompt=20, computed=20, output=1, placement=on0, blocks=2)
    elsewhere = req("e", Priority.HIGH, prompt=20, computed=20, output=1,
                    placement=single("cpu:1"), blocks=2)
    prompt = req("p", Priority.HIGH, prompt=30, computed=10, placement=on0, blocks=2)
    draft = Draft(make_view(runnable=[decs[0], low, elsewhere, prompt], running=[decs[1]]))
    plan = _prefill(draft, "cpu:0")
    pred = draft.simulate(plan)
    end = max(pred.finish[op.op_id] for op in plan.ops)
    assert decode_delay(draft, plan, pred) == pytest.approx(2 * end)  # d0 and d1 only
