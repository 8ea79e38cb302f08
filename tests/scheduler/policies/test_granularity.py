"""Adaptive operator granularity as pure decisions over hand-built views (policies/lowfill.py).

The weightless 4-layer model with variant chains (models/variants.py): its own chain runs
the 4 layers as one operator, the variant of 1 layer per group as 4. Cost model: 1 ms per
op plus 25 us per token and layer (embed and head: 0.5 ms plus 1 us per token), so a fine
chain pays three more hand-offs than the coarse one for the same tokens, and one fine op
carries 4x the tokens of a coarse op within the same time.
"""

from __future__ import annotations

import dataclasses
import re

import torch

from executors.types import Priority
from models.skeleton import skeleton
from scheduler.policies.slice import SlicePolicy
from scheduler.round.decision import RoundDecision
from scheduler.round.plan import Builder, Feed, Plan, sim_ops
from scheduler.round.requestview import RequestView
from scheduler.round.view import RoundView
from tests.scheduler.cluster import CONFIG
from tests.scheduler.conftest import layered_time, xfer_time
from tests.scheduler.views import CFG, make_view, req, single

LAYERS = re.compile(r"layers\[(\d+):(\d+)\]")


def _builder() -> Builder:
    model = skeleton(CONFIG, torch.float32, layer_groups=(1, 4))
    return Builder(model.template, CFG.block_size, layered_time, xfer_time)


def _paced(tpot_s: float) -> RequestView:
    """A high request decoding on cpu:0 with a `tpot_s` inter-token target."""
    r = req("hi", Priority.HIGH, prompt=40, max_tokens=64, slo=0.5, placement=single("cpu:0"),
            computed=40, output=1, blocks=4)
    return dataclasses.replace(r, tpot_slo_s=tpot_s, last_token_s=0.0)


def _view(tpot_s: float | None, prompt: int = 400) -> RoundView:
    """A low request of `prompt` tokens waiting; with `tpot_s`, a paced high request on
    cpu:0 whose decode step is in flight (its first op running since 0), at now = 0."""
    builder = _builder()
    low = req("lo", prompt=prompt, max_tokens=4)
    if tpot_s is None:
        return dataclasses.replace(make_view(waiting=(low,)), builder=builder)
    r = _paced(tpot_s)
    assert r.placement is not None
    step = builder.build(Plan(r.priority, r.placement, [[Feed(r, r.num_computed, 1)]]))
    ops = list(sim_ops(step, 0.0))
    ops[0] = ops[0]._replace(start=0.0)
    view = make_view(waiting=(low,), running=(r,), ops=tuple(ops))
    return dataclasses.replace(view, builder=builder, step_ends={r.rid: step.finals[-1].op_id})


def _low_plans(decision: RoundDecision) -> list[Plan]:
    return [p for p in decision.plans if p.priority is Priority.LOW]


def _layer_ops(plan: Plan) -> list[str]:
    return [op.name for op in plan.ops if LAYERS.fullmatch(op.name)]


def test_a_short_gap_gets_a_finer_group_than_a_long_one() -> None:
    # a 20 ms pace leaves a low op about 6.7 ms between two steps: a coarse op carries 56
    # tokens in it, a fine one 226; a 300 ms pace bounds it at 100 ms: both carry the prompt
    short = _low_plans(SlicePolicy().schedule(_view(0.02)))
    long = _low_plans(SlicePolicy().schedule(_view(0.3)))
    assert len(short) == 1 and len(long) == 1
    assert short[0].group_size == 1
    assert _layer_ops(short[0]) == [f"layers[{i}:{i + 1}]" for i in range(4)]
    assert long[0].group_size is None and _layer_ops(long[0]) == ["layers[0:4]"]
    assert short[0].num_tokens() > 56  # NOTE: more than a coarse op could carry in the gap


def test_with_nothing_waiting_the_coarse_chain_runs() -> None:
    plans = _low_plans(SlicePolicy().schedule(_view(None)))
    assert len(plans) == 1 and plans[0].group_size is None
    assert plans[0].num_tokens() == 400


def test_the_fine_ops_keep_the_pace_the_coarse_budget_keeps() -> None:
    # every fine op of the chosen plan fits the same bound as the coarse op would
    plan = _low_plans(SlicePolicy().schedule(_view(0.02)))[0]
    longest = max(op.est_s for op in plan.ops if LAYERS.fullmatch(op.name))
    assert longest <= 0.02 / 3


def test_high_plans_stay_on_the_model_chain() -> None:
    decision = SlicePolicy().schedule(_view(0.02))
    high = [p for p in decision.plans if p.priority is not Priority.LOW]
    assert all(p.group_size is None for p in high)


def test_a_variant_op_runs_where_its_layers_are_placed() -> None:
    builder = _builder()
    r = req("lo", prompt=64, max_tokens=4)
    # the coarse chain's 3 ops: embed on cpu:0, layers[0:4] and head on cpu:1
    plan = builder.build(Plan(Priority.LOW, ("cpu:0", "cpu:1", "cpu:1"), [[Feed(r, 0, 64)]],
                              group_size=1))
    compute = [(op.name, op.device) for op in plan.ops if op.template_index >= 0]
    assert compute == [("embed", "cpu:0"), *((f"layers[{i}:{i + 1}]", "cpu:1")
                                            for i in range(4)), ("head", "cpu:1")]
    assert [op.name for op in plan.ops].count("send") == 1
