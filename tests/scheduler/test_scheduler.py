"""The scheduler on the tiny model over two CPU executors: outputs, aborts, placements."""

from __future__ import annotations

import asyncio

import pytest
import torch

import models
from executors.types import Priority
from models.generate import generate
from models.sampling_params import SamplingParams
from scheduler.api import FinishReason, Overloaded, Request, RequestTooLarge
from scheduler.core import completions as completions_module
from scheduler.policies import POLICIES
from tests.scheduler.conftest import make_scheduler, stream

GREEDY = SamplingParams(temperature=0, max_tokens=10)


def _prompts() -> list[list[int]]:
    return [[(7 * i + j) % 1000 + 3 for j in range(3 + 53 * i)] for i in range(6)]


async def _collect(sched, req: Request) -> tuple[list[int], FinishReason | None]:  # type: ignore[no-untyped-def]
    out = await stream(sched, req)
    return out.tokens, out.finish


@pytest.mark.parametrize("policy", sorted(POLICIES))
async def test_same_greedy_tokens_under_every_policy(tiny_model: models.Model,
                                                     policy: str) -> None:
    sched = make_scheduler(tiny_model, policy)
    await sched.start()
    try:
        reqs = [Request(f"r{i}", "t", list(Priority)[i % 3], p, GREEDY, ttft_slo_s=1.0)
                for i, p in enumerate(_prompts())]
        got = await asyncio.gather(*[_collect(sched, r) for r in reqs])
    finally:
        await sched.stop()
    for (tokens, reason), p in zip(got, _prompts(), strict=True):
        assert tokens == generate(tiny_model, p, GREEDY).token_ids
        assert reason is FinishReason.LENGTH
    assert sched.kv.used_blocks() == 0 and not sched.states


PENALIZED = [
    SamplingParams(temperature=0, max_tokens=12, repetition_penalty=1.3),
    SamplingParams(temperature=0, max_tokens=12, presence_penalty=1.5, frequency_penalty=0.5),
    SamplingParams(temperature=0, max_tokens=12, logit_bias=((8, -100.0), (974, -100.0))),
    GREEDY,  # beside them in the same decode batches, on the fast path
]


async def test_penalties_and_bias_give_the_tokens_of_generate(tiny_model: models.Model) -> None:
    sched = make_scheduler(tiny_model, "slice")
    await sched.start()
    prompts = _prompts()[:4]
    try:
        reqs = [Request(f"p{i}", "t", Priority.HIGH, p, params, ttft_slo_s=1.0)
                for i, (p, params) in enumerate(zip(prompts, PENALIZED, strict=True))]
        got = await asyncio.gather(*[_collect(sched, r) for r in reqs])
    finally:
        await sched.stop()
    for (tokens, _), p, params in zip(got, prompts, PENALIZED, strict=True):
        assert tokens == generate(tiny_model, p, params).token_ids
    assert got[0][0] != generate(tiny_model, prompts[0], GREEDY).token_ids[:12]


async def test_lone_long_prefill_is_pipelined_over_both_devices(tiny_model: models.Model) -> None:
    sched = make_scheduler(tiny_model, "slice")
    await sched.start()
    prompt = [(5 * j) % 1000 + 3 for j in range(480)]
    try:
        tokens, _ = await _collect(sched, Request("p", "t", Priority.HIGH, prompt, GREEDY))
    finally:
        await sched.stop()
    assert tokens == generate(tiny_model, prompt, GREEDY).token_ids
    prefill_devices = {e["device"] for e in sched.timeline(0.0) if e["num_tokens"] > 1}
    assert prefill_devices == {"cpu:0", "cpu:1"}
    assert any(e["role"] == "send" for e in sched.timeline(0.0))


@pytest.mark.parametrize("delay_s", [60.0, completions_module.BOOK_AFTER_S])
async def test_ops_are_booked_after_their_tokens_and_listed_when_read(
        tiny_model: models.Model, monkeypatch: pytest.MonkeyPatch, delay_s: float) -> None:
    monkeypatch.setattr(completions_module, "BOOK_AFTER_S", delay_s)
    sched = make_scheduler(tiny_model, "slice")
    await sched.start()
    try:
        tokens, _ = await _collect(sched, Request("b", "t", Priority.HIGH, [5, 6, 7], GREEDY))
        await asyncio.sleep(0.2)
        booked = len(sched.books.since(0.0))  # what the timer booked by itself
        listed = len(sched.timeline(0.0))  # a reader books what is pending first
    finally:
        await sched.stop()
    assert len(tokens) == GREEDY.max_tokens
    if delay_s > 1:  # the last step's ops still wait for their timer
        assert booked < listed
    else:
        assert booked == listed


async def test_abort_frees_kv_and_removes_queued_ops(tiny_model: models.Model) -> None:
    sched = make_scheduler(tiny_model, "fcfs")
    await sched.start()
    try:
        long = SamplingParams(temperature=0, max_tokens=400)
        streams = [sched.submit(Request(f"a{i}", "t", Priority.LOW, p, long))
                   for i, p in enumerate(_prompts())]
        firsts = [await s.__anext__() for s in streams]  # every request is running now
        assert all(f.token_id is not None for f in firsts)
        for i in range(len(streams)):
            sched.abort(f"a{i}", "abort")
        for s in streams:
            rest = [ev async for ev in s]
            assert rest[-1].finish_reason is FinishReason.ABORT
        for _ in range(200):
            if not sched.gmg.scheduled and sched.kv.used_blocks() == 0:
                break
            await asyncio.sleep(0.01)
        assert sched.kv.used_blocks() == 0
        assert not sched.gmg.scheduled
        assert all(not e.queued() for e in sched.exec.executors.values())  # type: ignore[attr-defined]
    finally:
        await sched.stop()


async def test_submit_rejects_what_can_never_run(tiny_model: models.Model) -> None:
    sched = make_scheduler(tiny_model, "slice")
    await sched.start()
    try:
        with pytest.raises(RequestTooLarge):
            sched.submit(Request("big", "t", Priority.HIGH, [5] * 1000,
                                 SamplingParams(max_tokens=100)))
    finally:
        await sched.stop()
    with pytest.raises(Overloaded):
        sched.submit(Request("late", "t", Priority.HIGH, [5], GREEDY))


async def test_oom_candidate_is_never_issued(tiny_model: models.Model) -> None:
    sched = make_scheduler(tiny_model, "slice")
    await sched.start()
    ledger = sched.ledgers["cpu:0"]
    ledger.reserve("activations", ledger.free_bytes - 1024)  # cpu:0 has no room for activations
    try:
        tokens, _ = await _collect(sched, Request("o", "t", Priority.HIGH,
                                                  _prompts()[3], GREEDY))
    finally:
        await sched.stop()
    assert tokens == generate(tiny_model, _prompts()[3], GREEDY).token_ids
    assert {e["device"] for e in sched.timeline(0.0)} == {"cpu:1"}


async def test_logprobs_travel_to_token_events_and_equal_transformers(
        tiny_model: models.Model) -> None:
    """Chunked prefill (600 tokens > 512 per batch) scores every prompt position; a second
    request with the same prompt (its blocks cached) scores them all again."""
    from transformers import AutoModelForCausalLM

    prompt = [(11 * j) % 1000 + 3 for j in range(600)]
    asks = SamplingParams(temperature=0, max_tokens=3, logprobs=2, prompt_logprobs=1)
    sched = make_scheduler(tiny_model, "slice")
    await sched.start()
    try:
        events = []
        for i in range(2):
            events.append([ev async for ev in sched.submit(
                Request(f"lp{i}", "t", Priority.HIGH, prompt, asks, ttft_slo_s=1.0))])
        plain = [ev async for ev in sched.submit(Request("g", "t", Priority.HIGH, prompt,
                                                         GREEDY, ttft_slo_s=1.0))]
    finally:
        await sched.stop()
    assert all(ev.logprobs is None and ev.prompt_logprobs is None for ev in plain)
    tokens = [ev.token_id for ev in events[0] if ev.token_id is not None]
    hf = AutoModelForCausalLM.from_pretrained(tiny_model.path, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([prompt + tokens])).logits[0], -1)  # [n, V]
    for evs in events:
        first = evs[0].prompt_logprobs
        assert first is not None and first[0] is None and len(first) == len(prompt)
        got = torch.tensor([lp.logprob for lp in first[1:] if lp is not None])
        want = ref[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])]
        assert got.shape == want.shape and torch.allclose(got, want, atol=1e-3)
        for i, ev in enumerate(e for e in evs if e.token_id is not None):
            assert ev.logprobs is not None and ev.logprobs.token_id == tokens[i]
            assert abs(ev.logprobs.logprob - float(ref[len(prompt) - 1 + i, tokens[i]])) < 1e-3
            assert list(ev.logprobs.top_ids) == ref[len(prompt) - 1 + i].topk(2).indices.tolist()
