"""The tiny model under KV pressure: preempted requests swap or recompute, tokens unchanged."""

from __future__ import annotations

import asyncio

import pytest

import models
from executors.types import Device, Priority
from models.generate import generate
from models.kv_cache import KVCache
from models.sampling_params import SamplingParams
from scheduler.api import FinishReason, Request
from scheduler.config import SchedulerConfig
from scheduler.scheduler import Scheduler
from tests.scheduler.conftest import linear_time, xfer_time

GREEDY = SamplingParams(temperature=0, max_tokens=40)


def _prompts() -> list[list[int]]:
    return [[(11 * i + 7 * j) % 900 + 5 for j in range(60 + 13 * i)] for i in range(8)]


def _scheduler(model: models.Model, policy: str, swap_bytes: int, blocks: int) -> Scheduler:
    c = model.config
    per_block = KVCache.bytes_per_block(c.num_layers, 16, c.num_kv_heads, c.head_dim,
                                        model.dtype)
    cfg = SchedulerConfig(policy=policy, max_model_len=1024, max_batch_tokens=512,
                          kv_cache_bytes=blocks * per_block, swap_space_bytes=swap_bytes)
    devs = [Device("cpu:0", 256 << 20), Device("cpu:1", 256 << 20)]
    return Scheduler(model, devs, policy, linear_time, xfer_time, cfg)


async def _run(sched: Scheduler, classes: list[Priority]) -> list[tuple[list[int], object]]:
    async def one(i: int, prompt: list[int]) -> tuple[list[int], object]:
        events = [ev async for ev in sched.submit(Request(f"r{i}", "t", classes[i], prompt,
                                                          GREEDY))]
        return [e.token_id for e in events if e.token_id is not None], events[-1].finish_reason
    await sched.start()
    try:
        return await asyncio.gather(*[one(i, p) for i, p in enumerate(_prompts())])
    finally:
        await sched.stop()


@pytest.mark.parametrize(("policy", "swap"), [("priority", True), ("priority", False),
                                              ("slice", True), ("slice", False)])
async def test_preempted_requests_resume_with_the_same_greedy_tokens(
        tiny_model: models.Model, policy: str, swap: bool) -> None:
    # 2 x 24 blocks of 16 tokens; each request grows to 100-200 tokens (7-13 blocks)
    sched = _scheduler(tiny_model, policy, (1 << 24) if swap else 0, blocks=24)
    classes = [Priority.LOW, Priority.HIGH, Priority.LOW, Priority.NORMAL] * 2
    got = await _run(sched, classes)
    for (tokens, reason), prompt in zip(got, _prompts(), strict=True):
        assert reason is FinishReason.LENGTH
        assert tokens == generate(tiny_model, prompt, GREEDY).token_ids
    reqs = sched.requests
    assert sum(reqs.preemptions.values()) > 0
    assert (reqs.swapped_out_bytes > 0) == swap and (reqs.dropped_tokens > 0) == (not swap)
    assert sched.kv.used_blocks() == 0 and not sched.kv.swapped and not sched.states


async def test_a_request_without_max_tokens_reserves_only_its_prompt(
        tiny_model: models.Model) -> None:
    sched = _scheduler(tiny_model, "slice", 0, blocks=200)
    prompt = _prompts()[0]  # 60 tokens: 4 blocks
    params = SamplingParams(temperature=0, max_tokens=1024 - len(prompt))  # a chat default
    await sched.start()
    try:
        stream = sched.submit(Request("c", "t", Priority.HIGH, prompt, params))
        first = await anext(stream)
        held = {d: len(t) for d, t in sched.kv.reservations["c"].tables.items()}
        sched.abort("c", "abort")
        async for _ in stream:
            pass
    finally:
        await sched.stop()
    assert first.token_id is not None
    assert all(n <= 5 for n in held.values()), held  # its prompt (+1 token), not 1024 tokens
