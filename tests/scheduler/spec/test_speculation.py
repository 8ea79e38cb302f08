"""Speculative decoding in the real scheduler (tiny model): greedy parity, KV rollback, stops."""

from __future__ import annotations

import asyncio
import dataclasses
import random

import pytest

import models
from executors.types import Device, Priority
from models.batch import BatchShape
from models.generate import generate
from models.kv_cache import blocks_for
from models.prefix_cache import CachingAllocator, block_keys
from models.sampling_params import SamplingParams
from models.spec_config import SpecConfig
from scheduler.api import FinishReason, Request
from scheduler.config import SchedulerConfig
from scheduler.core.state import RequestState
from scheduler.round.plan import OpTime
from scheduler.scheduler import Scheduler
from tests.scheduler.conftest import linear_time, xfer_time

SPEC = SpecConfig(num_speculative_tokens=4, prompt_lookup_max=3, prompt_lookup_min=1)


def _scheduler(model: models.Model, policy: str = "slice", caching: bool = False,
               op_time: OpTime = linear_time) -> Scheduler:
    devs = [Device("cpu:0", 256 << 20)]
    cfg = SchedulerConfig(policy=policy, max_model_len=1024, max_batch_tokens=512,
                          prefix_caching=caching, block_size=16)
    return Scheduler(model, devs, policy, op_time, xfer_time, cfg)


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    """Prompts with repeats (a block of tokens said twice, as code returned with an edit)
    and without (random tokens)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        block = [rng.randrange(3, 250) for _ in range(rng.randint(8, 40))]
        out.append(block + [7] + block[:rng.randint(2, 6)] if i % 3 else block)
    return out


async def _run(sched: Scheduler, rid: str, prompt: list[int], sampling: SamplingParams,
               spec: SpecConfig | None) -> tuple[list[int], FinishReason | None]:
    tokens, reason = [], None
    async for ev in sched.submit(Request(rid, "t", Priority.NORMAL, prompt, sampling,
                                         speculative=spec)):
        if ev.token_id is not None:
            tokens.append(ev.token_id)
        reason = ev.finish_reason
    return tokens, reason


@pytest.mark.parametrize("policy", ["slice", "fcfs"])
async def test_greedy_output_is_token_for_token_the_plain_one(tiny_model: models.Model,
                                                              policy: str) -> None:
    greedy = SamplingParams(temperature=0, max_tokens=24)
    sched = _scheduler(tiny_model, policy)
    await sched.start()
    try:
        for i, prompt in enumerate(_prompts(24)):
            tokens, _ = await _run(sched, f"r{i}", prompt, greedy, SPEC)
            assert tokens == generate(tiny_model, prompt, greedy).token_ids, i
    finally:
        await sched.stop()
    c = sched.spec_counters
    assert c.num_drafts > 0 and c.num_accepted_tokens > 0, c  # drafts were verified, and kept
    assert c.num_accepted_tokens < c.num_draft_tokens  # and some rejected: rollback ran


def _flat_time(device: str, name: str, shape: BatchShape) -> float:
    """Weight reads dominate: 1 ms an op, 10 us a token (drafting pays in a batch)."""
    return 1e-3 + 1e-5 * shape.num_tokens


async def test_concurrent_requests_keep_parity_and_roll_back_rejected_kv(
        tiny_model: models.Model) -> None:
    greedy = SamplingParams(temperature=0, max_tokens=20)
    sched = _scheduler(tiny_model, caching=True, op_time=_flat_time)
    alloc = sched.kv.pools["cpu:0"].allocator
    assert isinstance(alloc, CachingAllocator)
    held_after_runs: list[tuple[int, int, int]] = []
    on_run = sched.completions._on_run

    def checked(s: RequestState, run: list[int]) -> None:
        on_run(s, run)
        if not s.finished:
            held_after_runs.append((blocks_for(s.num_computed, 16), len(s.tables["cpu:0"]),
                                    blocks_for(s.num_tokens, 16)))

    sched.completions._on_run = checked  # type: ignore[method-assign]
    await sched.start()
    try:
        prompts = _prompts(12, seed=1)
        outs = await asyncio.gather(*(_run(sched, f"c{i}", p, greedy, SPEC if i % 2 else None)
                                      for i, p in enumerate(prompts)))
    finally:
        await sched.stop()
    for p, (tokens, _) in zip(prompts, outs, strict=True):
        assert tokens == generate(tiny_model, p, greedy).token_ids
    c = sched.spec_counters
    assert c.num_accepted_tokens > 0 and c.num_accepted_tokens < c.num_draft_tokens
    # after every verify step the request holds the blocks of its verified tokens (those in
    # KV, and at most its next token's), none for rejected drafts
    assert held_after_runs and all(lo <= held <= hi for lo, held, hi in held_after_runs), \
        held_after_runs
    assert alloc.num_used == 0  # every block released
    # the prefix cache holds verified tokens' blocks only: each cached key is one of a
    # full block of some request's prompt + output
    verified = {k for p, (tokens, _) in zip(prompts, outs, strict=True)
                for k in block_keys(p + tokens, 16)}
    assert alloc.num_cached > 0 and set(alloc._by_key) <= verified


async def test_a_stop_token_inside_an_accepted_run_ends_the_request_there(
        tiny_model: models.Model) -> None:
    greedy = SamplingParams(temperature=0, max_tokens=24)
    prompt = _prompts(3)[1]
    plain = generate(tiny_model, prompt, greedy).token_ids
    stop = plain[5]
    sampling = SamplingParams(temperature=0, max_tokens=24, stop_token_ids=(stop,))
    expected = plain[:plain.index(stop) + 1]
    sched = _scheduler(tiny_model)
    await sched.start()
    try:
        for max_tokens in (3, len(expected), 24):
            s = SamplingParams(temperature=0, max_tokens=max_tokens, stop_token_ids=(stop,))
            tokens, reason = await _run(sched, f"m{max_tokens}", prompt, s, SPEC)
            want = expected[:max_tokens]
            assert tokens == want
            assert reason is (FinishReason.STOP if want == expected else FinishReason.LENGTH)
        tokens, _ = await _run(sched, "s", prompt, sampling, SPEC)
        assert tokens == expected
    finally:
        await sched.stop()


async def test_sampled_requests_verify_drafts_and_repeat_with_a_seed(
        tiny_model: models.Model) -> None:
    seeded = SamplingParams(temperature=0.3, top_k=5, seed=11, max_tokens=24)
    sched = _scheduler(tiny_model)
    await sched.start()
    try:
        prompt = _prompts(3)[1]
        first, _ = await _run(sched, "a", prompt, seeded, SPEC)
        again, _ = await _run(sched, "b", prompt, seeded, SPEC)
    finally:
        await sched.stop()
    assert first == again and len(first) == 24
    assert sched.spec_counters.num_drafts > 0


@pytest.mark.parametrize("sampling", [
    SamplingParams(temperature=0, max_tokens=16, logprobs=2),
    SamplingParams(temperature=0, max_tokens=16, frequency_penalty=0.5),
    SamplingParams(temperature=0, max_tokens=16, logit_bias=((5, 1.0),)),
    SamplingParams(temperature=0, max_tokens=16, min_tokens=16, stop_token_ids=(1,)),
])
async def test_requests_the_verify_path_cannot_honour_decode_without_drafts(
        tiny_model: models.Model, sampling: SamplingParams) -> None:
    sched = _scheduler(tiny_model)
    await sched.start()
    try:
        tokens, _ = await _run(sched, "r", _prompts(3)[1], sampling, SPEC)
    finally:
        await sched.stop()
    plain = dataclasses.replace(sampling, logprobs=None)  # `generate` returns no log-probs
    assert tokens == generate(tiny_model, _prompts(3)[1], plain).token_ids
    assert sched.spec_counters.num_drafts == 0
