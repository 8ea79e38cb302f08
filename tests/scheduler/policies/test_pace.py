"""The TPOT guard as pure decisions over hand-built views (policies/pace.py).

Cost model: 1 ms per op + 0.1 ms per token (tests/scheduler/conftest.py); the weightless
chain has 6 ops, so a one-token decode step takes about 6.6 ms on one device.
"""

from __future__ import annotations

import dataclasses

from executors.types import Priority
from scheduler.config import SchedulerConfig
from scheduler.policies.common import decode_plans
from scheduler.policies.lowfill import TPOT_OP_FRACTION
from scheduler.policies.pace import keeps_pace
from scheduler.policies.scoring import harmless
from scheduler.policies.slice import SlicePolicy
from scheduler.round.draft import Draft
from scheduler.round.plan import Builder, Feed, Plan, sim_ops
from scheduler.round.requestview import RequestView
from scheduler.round.view import RoundView
from scheduler.sim.simulator import simulate
from tests.scheduler.cluster import weightless
from tests.scheduler.conftest import linear_time, xfer_time
from tests.scheduler.views import CFG, make_view, req, single

TPOT_S = 0.02


def _paced(tpot: float | None = TPOT_S, placement: str = "cpu:0") -> RequestView:
    """A high request decoding on `placement`: 40 prompt tokens, one output token."""
    r = req("hi", Priority.HIGH, prompt=40, max_tokens=64, slo=0.5, placement=single(placement),
            computed=40, output=1, blocks=4)
    return dataclasses.replace(r, tpot_slo_s=tpot, last_token_s=0.0)


def _stepping_view(r: RequestView, waiting: tuple[RequestView, ...] = (),
                   cfg: SchedulerConfig = CFG) -> RoundView:
    """`r` with its decode step in flight (its first op running since 0), at now = 0."""
    builder = Builder(weightless().template, cfg.block_size, linear_time, xfer_time)
    assert r.placement is not None
    step = builder.build(Plan(r.priority, r.placement, [[Feed(r, r.num_computed, 1)]]))
    ops = list(sim_ops(step, 0.0))
    ops[0] = ops[0]._replace(start=0.0)
    view = make_view(waiting=waiting, running=(r,), ops=tuple(ops), cfg=cfg)
    return dataclasses.replace(view, builder=builder, step_ends={r.rid: step.finals[-1].op_id})


def _low_plan(draft: Draft, device: str, prompt: int) -> Plan:
    low = req("lo", prompt=prompt, max_tokens=4)
    return draft.view.builder.build(Plan(Priority.LOW, single(device),
                                         [[Feed(low, 0, prompt)]]))


def test_a_decode_deadline_vetoes_a_low_op_that_breaks_it() -> None:
    # a 400-token low prefill: 41 ms per op on cpu:0, where the next step is due 20 ms on
    draft = Draft(_stepping_view(_paced()))
    assert not keeps_pace(draft, _low_plan(draft, "cpu:0", 400))
    assert not harmless(draft, _low_plan(draft, "cpu:0", 400))


def test_without_a_tpot_slo_the_same_low_op_is_issued() -> None:
    draft = Draft(_stepping_view(_paced(tpot=None)))
    assert harmless(draft, _low_plan(draft, "cpu:0", 400))


def test_a_low_op_on_another_device_keeps_the_pace() -> None:
    draft = Draft(_stepping_view(_paced()))
    assert harmless(draft, _low_plan(draft, "cpu:1", 400))


def test_a_short_low_op_fits_the_gap() -> None:
    # 40 tokens: 5 ms per op; the next step waits for at most one of them
    draft = Draft(_stepping_view(_paced()))
    assert keeps_pace(draft, _low_plan(draft, "cpu:0", 40))


def test_a_paced_request_without_a_step_in_flight_is_guarded_too() -> None:
    r = _paced()
    draft = Draft(make_view(runnable=(r,)))
    assert not keeps_pace(draft, _low_plan(draft, "cpu:0", 400))


def test_a_missed_pace_restarts_from_now() -> None:
    r = dataclasses.replace(_paced(), last_token_s=-1.0)  # its deadline passed long ago
    assert r.next_token_deadline(0.0) == TPOT_S
    assert dataclasses.replace(r, last_token_s=-0.005).next_token_deadline(0.0) == \
        -0.005 + TPOT_S


def test_slice_keeps_low_work_off_the_paced_device_when_chunks_cannot_fit() -> None:
    # chunks of at least 256 tokens (26.6 ms per op) never fit a 20 ms pace
    cfg = dataclasses.replace(CFG, min_lp_chunk_tokens=256)
    low = req("lo", prompt=400, max_tokens=4)
    paced = SlicePolicy().schedule(_stepping_view(_paced(), (low,), cfg))
    assert [p.placement[0] for p in paced.plans] == ["cpu:1"]
    free = SlicePolicy().schedule(_stepping_view(_paced(tpot=None), (low,), cfg))
    assert [p.placement[0] for p in free.plans] == ["cpu:0"]


def test_slice_sizes_low_chunks_to_the_pace() -> None:
    low = req("lo", prompt=400, max_tokens=4)
    view = _stepping_view(_paced(), (low,))
    decision = SlicePolicy().schedule(view)
    (plan,) = decision.plans
    assert plan.placement[0] == "cpu:0"
    assert max(op.est_s for op in plan.ops) <= TPOT_OP_FRACTION * TPOT_S
    pred = simulate(view.snapshot, plan.candidate)  # type: ignore[arg-type]
    assert pred.end > 0


def test_a_paced_request_decodes_in_a_step_of_its_own_class() -> None:
    lo = req("lo", prompt=40, max_tokens=8, placement=single("cpu:0"), computed=40, output=1,
             blocks=4)
    plans = decode_plans(Draft(make_view(runnable=(_paced(), lo))), lambda r: r.priority)
    assert sorted((p.priority, p.rids) for p in plans) == [(Priority.HIGH, ("hi",)),
                                                         (Priority.LOW, ("lo",))]
    mixed = decode_plans(Draft(make_view(runnable=(_paced(tpot=None), lo))),
                         lambda r: r.priority)
    assert [(p.priority, set(p.rids)) for p in mixed] == [(Priority.LOW, {"hi", "lo"})]


def test_no_pending_step_after_the_last_token() -> None:
    # its step in flight yields its last token: no step follows it to be delayed
    last = dataclasses.replace(_paced(), max_tokens=2)
    draft = Draft(_stepping_view(last))
    assert keeps_pace(draft, _low_plan(draft, "cpu:0", 400))


def test_paced_requests_of_one_placement_share_one_pending_step() -> None:
    # after a 7 ms low op, three one-token steps one after another (6.6 ms each) would end
    # past a 25 ms pace; their one shared step (7.8 ms) does not
    paced = [dataclasses.replace(_paced(tpot=0.025), rid=f"hi{i}") for i in range(3)]
    draft = Draft(make_view(runnable=paced))
    assert keeps_pace(draft, _low_plan(draft, "cpu:0", 60))
