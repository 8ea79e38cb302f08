"""`stats.collect`: the scheduler's figures per model of a model set (models/modelset.py),
every served model present; and per its only model ("") for one. Fake executors on a
virtual clock (tests/scheduler/cluster.py)."""

from __future__ import annotations

from executors.types import Priority
from models.modelset import model_set
from scheduler.config import SchedulerConfig
from tests.scheduler.cluster import ClusterRun, weightless
from tests.scheduler.memory.test_kv_property import BLOCK_BYTES
from tests.scheduler.memory.test_model_pools import three_models

BASE = [(13 * j) % 900 + 7 for j in range(48)]


async def test_preemptions_and_slo_attainment_are_counted_under_each_requests_model() -> None:
    """`chat` and `batch` share one pool of 20 blocks: chat's high request preempts batch's
    low ones, so only batch counts preemptions and only chat (with an SLO) attainment."""
    cfg = SchedulerConfig(policy="priority", max_model_len=256, max_batch_tokens=64,
                          kv_cache_bytes=20 * BLOCK_BYTES, swap_space_bytes=0, kv_watermark=0.0)
    pair = model_set([("chat", weightless(), None), ("batch", weightless(), None)])
    async with ClusterRun("priority", devices=1, cfg=cfg, model=pair) as run:
        low = [run.submit(f"l{i}", Priority.LOW, 0, 40, prompt=BASE + [i + 3] * 60,
                          model="batch") for i in range(3)]
        while not all(o.tokens for o in low):
            await run.run_until(run.cluster.now + 0.001)
        busy = run.sched.stats()
        high = run.submit("h", Priority.HIGH, 0, 40, prompt=[9] * 180, slo_s=5.0, model="chat")
        await run.run_out()
        stats = run.sched.stats()
    assert all(o.error is None and len(o.tokens) == 40 for o in [*low, high])
    # one pool: both models report its usage, all of it taken by batch's three requests
    assert busy.kv_cache_usage_by_model["chat"] == busy.kv_cache_usage_by_model["batch"] > 0.5
    assert stats.kv_cache_usage_by_model == {"chat": 0.0, "batch": 0.0}
    assert stats.num_preemptions and {m for m, _, _ in stats.num_preemptions} == {"batch"}
    assert all(c == "low" for _, _, c in stats.num_preemptions)
    assert stats.slo_attainment_by_model == {("chat", "high"): 1.0}
    assert set(stats.spec_decode) == {"chat", "batch"}
    assert stats.spec_decode["chat"].num_drafts == stats.spec_decode["batch"].num_drafts == 0


async def test_kv_usage_is_that_of_the_pools_each_model_uses_on_its_devices() -> None:
    """`big` has a pool of its own layout on cpu:0; `chat` and `twin` share the other pools.
    A request of `big` fills big's pool only; one of `twin`, run on one device, counts against
    the shared pools of both devices (twin runs on both)."""
    async with ClusterRun("slice", model=three_models()) as run:
        big = run.submit("b", Priority.NORMAL, 200, 30, model="big")
        while not big.tokens:
            await run.run_until(run.cluster.now + 0.001)
        during = run.sched.stats().kv_cache_usage_by_model
        await run.run_out()
        twin = run.submit("t", Priority.NORMAL, 200, 30, model="twin")
        while not twin.tokens:
            await run.run_until(run.cluster.now + 0.001)
        shared = run.sched.stats().kv_cache_usage_by_model
        kv = run.sched.kv
        pools = [kv.pools["cpu:0"].allocator, kv.pools["cpu:1"].allocator]
        used, total = sum(a.num_used for a in pools), sum(a.num_blocks for a in pools)
        await run.run_out()
    assert set(during) == {"chat", "twin", "big"}
    assert during["big"] > 0 and during["chat"] == during["twin"] == 0.0
    assert shared["big"] == 0.0 and shared["chat"] == shared["twin"] > 0
    assert shared["twin"] == used / total  # over both devices' shared pools
    assert kv.models_of("cpu:0") == ["chat", "twin"] and kv.models_of("cpu:0#big") == ["big"]


async def test_one_model_is_reported_under_the_empty_name() -> None:
    async with ClusterRun("slice") as run:
        out = run.submit("r", Priority.HIGH, 40, 3, slo_s=5.0)
        await run.run_out()
        stats = run.sched.stats()
    assert out.error is None and len(out.tokens) == 3
    assert stats.kv_cache_usage_by_model == {"": 0.0}
    assert stats.slo_attainment_by_model == {("", "high"): 1.0}
    assert set(stats.spec_decode) == {""}
