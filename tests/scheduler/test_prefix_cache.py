"""Prefix caching in the scheduler: equal outputs, shared blocks, released references, salts."""

from __future__ import annotations

import pytest

import models
from executors.types import Device, Priority
from models.generate import generate
from models.prefix_cache import CachingAllocator, block_keys
from models.sampling_params import SamplingParams
from scheduler.api import Request
from scheduler.config import SchedulerConfig
from scheduler.scheduler import Scheduler
from tests.scheduler.cluster import ClusterRun
from tests.scheduler.conftest import linear_time, stream, xfer_time
from tests.scheduler.memory.test_kv_property import BLOCK_BYTES

GREEDY = SamplingParams(temperature=0, max_tokens=8)
BASE = [(13 * j) % 900 + 7 for j in range(100)]  # 6 full blocks of 16, and 4 tokens


def _scheduler(model: models.Model, policy: str, caching: bool) -> Scheduler:
    devs = [Device("cpu:0", 256 << 20), Device("cpu:1", 256 << 20)]
    cfg = SchedulerConfig(policy=policy, max_model_len=1024, max_batch_tokens=512,
                          prefix_caching=caching)
    return Scheduler(model, devs, policy, linear_time, xfer_time, cfg)


async def _run(sched: Scheduler, rid: str, prompt: list[int], salt: str = ""
               ) -> tuple[list[int], int]:
    out = await stream(sched, Request(rid, "t", Priority.HIGH, prompt, GREEDY, cache_salt=salt))
    return out.tokens, out.num_cached


# (prompt, tokens cached after BASE ran): a shared prefix, a prefix ending mid-block (two
# full blocks shared, then it differs), the same prompt again (all but its last block),
# a cached prompt of whole blocks (its last block is computed again: the head needs its last
# token's state), and a prompt that shares nothing
CASES = [(BASE + [5, 6, 7, 8, 9], 96), (BASE[:40] + [1] * 30, 32), (BASE, 96),
         (BASE[:96], 80), ([11] * 50, 0)]


@pytest.mark.parametrize("policy", ["slice", "fcfs"])
async def test_greedy_outputs_equal_with_and_without_the_cache(tiny_model: models.Model,
                                                               policy: str) -> None:
    for caching in (True, False):
        sched = _scheduler(tiny_model, policy, caching)
        await sched.start()
        try:
            assert (await _run(sched, "base", BASE))[1] == 0
            for i, (prompt, cached) in enumerate(CASES):
                tokens, reported = await _run(sched, f"r{i}", prompt)
                assert tokens == generate(tiny_model, prompt, GREEDY).token_ids, (caching, i)
                assert reported == (cached if caching else 0)
        finally:
            await sched.stop()
        assert sched.kv.used_blocks() == 0 and not sched.states
        cache = sched.kv.caching("cpu:0") or sched.kv.caching("cpu:1")
        assert (cache is not None) == caching


async def test_two_requests_sharing_a_prefix_hold_one_copy() -> None:
    async with ClusterRun("slice", devices=1, kv_check=True) as run:
        a = run.submit("a", Priority.HIGH, 0, 200, prompt=BASE)
        while not a.tokens:
            await run.run_until(run.cluster.now + 0.001)
        b = run.submit("b", Priority.HIGH, 0, 30, prompt=BASE[:64] + [3] * 40)
        while not b.tokens:
            await run.run_until(run.cluster.now + 0.001)
        assert b.num_cached_tokens == 64 and a.num_cached_tokens == 0
        tables = run.sched.requests.states["a"].tables["cpu:0"], \
            run.sched.requests.states["b"].tables["cpu:0"]
        assert tables[0][:4] == tables[1][:4] and not set(tables[0][4:]) & set(tables[1][4:])
        alloc = run.sched.kv.pools["cpu:0"].allocator
        assert isinstance(alloc, CachingAllocator)
        assert alloc.num_used == len(set(tables[0]) | set(tables[1]))
        run.sched.abort("a", "abort")
        # NOTE: "a" may share a decode step with "b": it ends when that step does
        while "a" in run.sched.states and run.cluster.now < 10.0:
            await run.run_until(run.cluster.now + 0.001)
        assert alloc.num_used == len(tables[1]) and all(alloc.ref_count(b) == 1
                                                        for b in tables[1])
        await run.run_out()
    assert not run.kv_model.mismatches  # type: ignore[union-attr]
    assert alloc.num_used == 0 and alloc.num_free == alloc.num_blocks
    assert b.error is None and len(b.tokens) == 30


async def test_preemption_releases_references_and_the_pool_returns_whole() -> None:
    cfg = SchedulerConfig(policy="priority", max_model_len=256, max_batch_tokens=64,
                          kv_cache_bytes=20 * BLOCK_BYTES, swap_space_bytes=0, kv_watermark=0.0)
    async with ClusterRun("priority", devices=1, cfg=cfg, kv_check=True) as run:
        alloc = run.sched.kv.pools["cpu:0"].allocator
        assert alloc.num_blocks == 20
        low = [run.submit(f"l{i}", Priority.LOW, 0, 40, prompt=BASE[:48] + [i + 3] * 60)
               for i in range(3)]
        while not all(o.tokens for o in low):
            await run.run_until(run.cluster.now + 0.001)
        assert [o.num_cached_tokens for o in low] == [0, 48, 48]
        high = run.submit("h", Priority.HIGH, 0, 40, prompt=[9] * 180)
        await run.run_out()
    assert run.sched.stats().num_preemptions, "the test needs preemptions"
    assert not run.kv_model.mismatches  # type: ignore[union-attr]
    assert all(o.error is None and len(o.tokens) == 40 for o in [*low, high])
    assert alloc.num_used == 0 and alloc.num_free == 20


async def test_salted_requests_never_hit_each_others_blocks(tiny_model: models.Model) -> None:
    sched = _scheduler(tiny_model, "slice", True)
    await sched.start()
    try:
        await _run(sched, "a", BASE, salt="tenant-a")
        assert (await _run(sched, "b", BASE, salt="tenant-b"))[1] == 0
        assert (await _run(sched, "c", BASE))[1] == 0
        assert (await _run(sched, "a2", BASE, salt="tenant-a"))[1] == 96
    finally:
        await sched.stop()


async def test_slice_places_a_request_where_its_prefix_is_cached() -> None:
    async with ClusterRun("slice", devices=2) as run:
        run.submit("busy", Priority.HIGH, 0, 2, prompt=[4] * 100)  # first, on cpu:0
        run.submit("warm", Priority.HIGH, 0, 2, prompt=BASE)  # so on cpu:1
        await run.run_out()
        keys = block_keys(BASE, 16)
        assert [d for d in ("cpu:0", "cpu:1") if run.sched.kv.cached_prefix(d, keys)[0]] \
            == ["cpu:1"]  # NOTE: on idle devices the tie goes to cpu:0 but for the cache
        for i in range(3):
            run.submit(f"r{i}", Priority.HIGH, 0, 2, prompt=BASE + [i + 3] * 20)
            await run.run_out()
    # NOTE: a hit counts only on the device holding the prefix
    assert all(run.outcomes[f"r{i}"].num_cached_tokens == 96 for i in range(3))
