"""Fair share within a class (VTC): counters, the fair order, and a flood that starves nobody."""

from __future__ import annotations

import pytest

from executors.types import Priority
from scheduler.api import FinishReason
from scheduler.config import SchedulerConfig
from scheduler.core.fairness import FairShare, jain_index
from scheduler.policies.common import fair_order
from scheduler.round.requestview import RequestView
from tests.scheduler.cluster import ClusterRun

L = Priority.LOW


def view(rid: str, tenant: str, arrival_s: float, prompt_len: int = 10) -> RequestView:
    return RequestView(rid, tenant, L, arrival_s, None, prompt_len, 4, 0, 0, None)


def test_jain_index() -> None:
    assert jain_index([5, 5, 5]) == pytest.approx(1.0)
    assert jain_index([1, 0, 0, 0]) == pytest.approx(0.25)
    assert jain_index([]) == 1.0


def test_counters_are_lifted_when_a_tenant_comes_back() -> None:
    f = FairShare()
    f.on_arrival(L, "a", [])
    f.charge(L, "a", 1000)
    f.on_arrival(L, "b", ["a"])  # b was idle: it starts level with the least waiting tenant
    assert f.counters[L]["b"] == 1000
    f.charge(L, "b", 10)
    f.on_arrival(L, "b", ["a", "b"])  # already waiting: no lift
    assert f.counters[L]["b"] == 1010
    assert f.served[L] == {"a": 1000, "b": 10}
    assert f.jain()["low"] == pytest.approx(1010 ** 2 / (2 * (1000 ** 2 + 10 ** 2)))


def test_fair_order_interleaves_tenants_by_counter() -> None:
    flood = [view(f"a{i}", "a", i * 0.001) for i in range(5)]
    steady = [view("b0", "b", 1.0), view("b1", "b", 2.0)]
    order = fair_order(flood + steady, {"a": 0.0, "b": 0.0})
    assert [r.rid for r in order] == ["a0", "b0", "a1", "b1", "a2", "a3", "a4"]
    # a tenant served more waits behind one served less
    order = fair_order(flood + steady, {"a": 100.0, "b": 0.0})
    assert [r.rid for r in order[:3]] == ["b0", "b1", "a0"]


def distinct(n: int, seed: int) -> list[int]:
    """A prompt of `n` tokens whose first block no other seed's shares (no prefix cache hits)."""
    return [3 + seed % 50, 3 + seed // 50] + [3 + (seed + j) % 50 for j in range(n - 2)]


@pytest.mark.parametrize("policy", ["slice", "priority"])
async def test_a_flooding_low_tenant_does_not_starve_another(policy: str) -> None:
    cfg = SchedulerConfig(policy=policy, max_model_len=1024, max_batch_tokens=128,
                          max_decode_seqs=4)
    async with ClusterRun(policy, cfg=cfg, mem=24 << 20) as run:
        flood = [run.submit(f"a{i}", L, 120, max_tokens=8, tenant="flood",
                            prompt=distinct(120, i)) for i in range(60)]
        await run.run_until(0.05)
        steady = [run.submit(f"b{i}", L, 120, max_tokens=8, tenant="steady",
                             prompt=distinct(120, 100 + i)) for i in range(6)]
        await run.run_out()
    assert all(o.finish is FinishReason.LENGTH for o in flood + steady)
    ends = sorted(o.finished_at for o in flood + steady if o.finished_at is not None)
    last_steady = max(o.finished_at for o in steady if o.finished_at is not None)
    # arrival order would serve the 60 flood requests first; fair share serves the steady
    # tenant's six requests within the first third of the completions
    assert ends.index(last_steady) < len(ends) // 3
    served = run.sched.fair.served[L]
    assert served["flood"] > served["steady"] > 0
