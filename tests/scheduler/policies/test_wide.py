"""Wide plans (executors/wide.py) as `slice` builds, simulates and chooses them: a long
urgent prompt on one device with another's cores lent, where that brings its first token
earliest (hand-built views; the simulator runs the claim and the hold as any op)."""

from __future__ import annotations

import pytest

from executors.types import OpRole, Priority
from scheduler.api import FinishReason
from scheduler.policies import make_policy
from scheduler.round.plan import Feed, Plan, to_candidate
from scheduler.round.view import RoundView
from scheduler.sim.gmg import SimOp
from scheduler.sim.simulator import simulate
from tests.scheduler.cluster import ClusterRun, mixed_load
from tests.scheduler.views import make_view, req, single

PARTNERS = {"cpu:0": ("cpu:1",), "cpu:1": ("cpu:0",)}


def _wide_view(factor: float | None, **kw: object) -> RoundView:
    view = make_view(**kw)  # type: ignore[arg-type]
    view.builder.wide_factor = factor
    view.builder.partners = dict(PARTNERS)
    return view


def test_a_wide_plan_claims_its_partner_before_the_chain_and_holds_it_to_the_end() -> None:
    view = _wide_view(0.5)
    r = req("hp", Priority.HIGH, prompt=480, slo=10.0)
    one = view.builder.build(Plan(Priority.HIGH, single("cpu:0"), [[Feed(r, 0, 480)]]))
    wide = view.builder.build(Plan(Priority.HIGH, single("cpu:0"), [[Feed(r, 0, 480)]],
                                   wide="cpu:1"))
    claim, held, *chain = wide.ops
    assert (claim.name, claim.device, claim.role) == ("claim", "cpu:1", OpRole.HOLD)
    assert (held.name, held.device, held.deps, held.input) == ("hold", "cpu:1", (claim,),
                                                              wide.finals[-1])
    assert claim in chain[0].deps and all(op.wide is held for op in chain)
    assert [op.est_s for op in chain] == pytest.approx([0.5 * op.est_s for op in one.ops])
    assert held.est_s == pytest.approx(sum(op.est_s for op in chain))
    assert wide.devices == ("cpu:0", "cpu:1") and one.devices == ("cpu:0",)
    with pytest.raises(ValueError, match="one device"):
        view.builder.build(Plan(Priority.HIGH, single("cpu:0"), [[Feed(r, 0, 480)]],
                                wide="cpu:0"))


def test_a_wide_chain_waits_for_its_partner_to_finish_what_it_runs() -> None:
    busy = SimOp(90_001, "layers[0:1]", "cpu:1", Priority.LOW, (), 0.5, 0.0, 0.0, 0, (), 0.0)
    view = _wide_view(0.5, ops=(busy,))
    r = req("hp", Priority.HIGH, prompt=480, slo=10.0)
    wide = view.builder.build(Plan(Priority.HIGH, single("cpu:0"), [[Feed(r, 0, 480)]],
                                   wide="cpu:1"))
    pred = simulate(view.snapshot, to_candidate(wide, {}))
    chain_s = sum(op.est_s for op in wide.ops[2:])
    assert pred.first_token["hp"] == pytest.approx(0.5 + chain_s)


def test_a_long_urgent_prompt_goes_wide_when_that_brings_its_first_token_earliest() -> None:
    # the chunked pipeline over both devices: first token at 0.195 s
    hp = req("hp", Priority.HIGH, prompt=480, slo=0.2)
    (plan,) = make_policy("slice").schedule(_wide_view(0.5, waiting=[hp])).plans
    assert plan.wide == "cpu:1" and len(set(plan.placement)) == 1
    assert plan.placement == single("cpu:0")
    # a deadline the pipeline keeps with room: the pipeline, though a wide plan is earlier
    roomy = req("hp", Priority.HIGH, prompt=480, slo=10.0)
    (plan,) = make_policy("slice").schedule(_wide_view(0.5, waiting=[roomy])).plans
    assert plan.wide is None and len(set(plan.placement)) == 2
    # no deadline at all: never wide
    (plan,) = make_policy("slice").schedule(_wide_view(0.5, waiting=[
        req("n", Priority.NORMAL, prompt=480)])).plans
    assert plan.wide is None
    # not profiled (one device, or Ray): the chunked pipeline over both, as before
    (plan,) = make_policy("slice").schedule(_wide_view(None, waiting=[hp])).plans
    assert plan.wide is None and len(set(plan.placement)) == 2
    # two threads hardly faster than one: the pipeline wins
    (plan,) = make_policy("slice").schedule(_wide_view(0.95, waiting=[hp])).plans
    assert plan.wide is None and len(set(plan.placement)) == 2


def test_a_short_prompt_never_goes_wide() -> None:
    hp = req("hp", Priority.HIGH, prompt=200, slo=0.05)
    (plan,) = make_policy("slice").schedule(_wide_view(0.3, waiting=[hp])).plans
    assert plan.wide is None


def _widen(run: ClusterRun, factor: float) -> None:
    run.sched.builder.wide_factor = factor
    run.sched.builder.partners = dict(PARTNERS)


async def test_a_wide_prefill_runs_end_to_end_and_frees_its_partner() -> None:
    firsts = {}
    for factor in (None, 0.5):
        async with ClusterRun("slice") as run:
            if factor is not None:
                _widen(run, factor)
            hp = run.submit("hp", Priority.HIGH, 480, 4, slo_s=0.2)
            await run.run_until(0.001)
            low = run.submit("low", Priority.LOW, 100, 4)
            await run.run_out()
        assert hp.finish is FinishReason.LENGTH and low.finish is FinishReason.LENGTH
        assert run.sched.kv.used_blocks() == 0 and not run.sched.gmg.scheduled
        wide = [op for op in run.ops if op.wide is not None]
        assert bool(wide) == (factor is not None)
        assert all(op.device == wide[0].device for op in wide)
        assert hp.first_token_at is not None
        firsts[factor] = hp.first_token_at
    assert firsts[0.5] < firsts[None]


async def test_a_mixed_workload_with_wide_plans_completes_and_returns_its_kv() -> None:
    async with ClusterRun("slice") as run:
        _widen(run, 0.6)
        await mixed_load(run, seed=3, max_prompt=500, slo_s=0.15)
    assert all(o.finish is FinishReason.LENGTH for o in run.outcomes.values())
    assert run.sched.kv.used_blocks() == 0 and not run.sched.states
    assert any(op.wide is not None for op in run.ops)
