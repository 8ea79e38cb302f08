"""Every policy end to end on fake executors (virtual clock, weightless model)."""

from __future__ import annotations

import pytest

from executors.types import Priority
from scheduler.api import FinishReason
from scheduler.policies import POLICIES
from tests.scheduler.cluster import ClusterRun, mixed_load


@pytest.mark.parametrize("policy", sorted(POLICIES))
async def test_every_request_completes_and_kv_returns(policy: str) -> None:
    async with ClusterRun(policy) as run:
        await mixed_load(run, seed=1)
    for rid, out in run.outcomes.items():
        assert out.finish is FinishReason.LENGTH, (rid, out)
    assert run.sched.kv.used_blocks() == 0 and not run.sched.states
    assert not run.sched.gmg.scheduled and run.sched.stats().errors_total == 0


@pytest.mark.parametrize("policy", ["priority", "static", "slice"])
async def test_low_priority_decodes_never_run_at_a_higher_class(policy: str) -> None:
    async with ClusterRun(policy) as run:
        await mixed_load(run, seed=2)
    prio = run.classes
    # NOTE: every prompt has 2+ tokens, so an op with one token per sequence is a decode step
    decodes = [op for op in run.ops if op.shape.num_tokens == op.shape.num_seqs]
    assert any(prio[r] is Priority.LOW for op in decodes for r in op.request_ids)
    for op in decodes:
        assert all(op.priority >= prio[r] for r in op.request_ids), op


async def test_slice_meets_deadlines_that_fcfs_misses_under_a_low_flood() -> None:
    met = {}
    for policy in ("slice", "fcfs"):
        async with ClusterRun(policy) as run:
            for i in range(40):
                run.submit(f"lp{i}", Priority.LOW, 500, 20)
            for i in range(10):
                await run.run_until(0.05 + 0.2 * i)
                run.submit(f"hp{i}", Priority.HIGH, 200, 4, slo_s=0.15)
            await run.run_out()
        hp = [o for rid, o in run.outcomes.items() if rid.startswith("hp")]
        met[policy] = sum(1 for i, o in enumerate(hp)
                          if o.first_token_at is not None
                          and o.first_token_at - (0.05 + 0.2 * i) <= 0.15)
    assert met["slice"] == 10 > met["fcfs"]
