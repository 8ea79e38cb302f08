"""FakeScheduler: the SchedulerAPI fake the gateway tests run against."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from executors.types import Priority
from models.sampling_params import SamplingParams
from scheduler.api import (
    FinishReason,
    Overloaded,
    Request,
    RequestTooLarge,
    SchedulerAPI,
    TokenEvent,
)
from scheduler.testing.fake import FakeConfig, FakeScheduler

pytestmark = pytest.mark.asyncio(loop_scope="session")


def _request(rid: str = "r0", prompt: list[int] | None = None, priority: Priority = Priority.HIGH,
             **sampling: Any) -> Request:
    params = SamplingParams(**sampling)
    return Request(rid, "t", priority, prompt or [1, 2, 3], params)


async def _drain(stream: AsyncIterator[TokenEvent]) -> list[TokenEvent]:
    return [event async for event in stream]


@pytest.fixture
async def fake() -> AsyncIterator[FakeScheduler]:
    scheduler = FakeScheduler(FakeConfig(vocab_size=100, max_model_len=64, num_kv_blocks=16,
                                         kv_block_tokens=8))
    await scheduler.start()
    yield scheduler
    await scheduler.stop(drain=False)


async def test_implements_the_protocol() -> None:
    scheduler: SchedulerAPI = FakeScheduler()
    assert scheduler.stats().healthy


async def test_tokens_are_deterministic_and_honor_max_tokens(fake: FakeScheduler) -> None:
    a = await _drain(fake.submit(_request("a", seed=7, max_tokens=5)))
    b = await _drain(fake.submit(_request("b", seed=7, max_tokens=5)))
    c = await _drain(fake.submit(_request("c", seed=8, max_tokens=5)))
    assert [e.token_id for e in a] == [e.token_id for e in b] != [e.token_id for e in c]
    assert [e.index for e in a] == [0, 1, 2, 3, 4]
    assert a[-1].finish_reason is FinishReason.LENGTH
    assert all(e.finish_reason is None for e in a[:-1])
    assert fake.kv_blocks_in_use == 0


async def test_stop_token_after_min_tokens() -> None:
    scheduler = FakeScheduler(FakeConfig(vocab_size=10, eos_after=1))
    await scheduler.start()
    events = await _drain(scheduler.submit(_request(max_tokens=9, min_tokens=4,
                                                    stop_token_ids=(3,))))
    assert [e.token_id for e in events[:4]].count(3) == 0
    assert events[-1].token_id == 3 and events[-1].finish_reason is FinishReason.STOP
    assert len(events) == 5
    await scheduler.stop()


async def test_a_stop_token_ends_nothing_before_min_tokens() -> None:
    """Every token the fake can draw is a stop id: the stop rule still waits for
    `min_tokens`, as the real scheduler's does (`SamplingParams.finish`)."""
    scheduler = FakeScheduler(FakeConfig(vocab_size=1))
    await scheduler.start()
    events = await _drain(scheduler.submit(_request(prompt=[0], max_tokens=9, min_tokens=4,
                                                    stop_token_ids=(0,))))
    assert [e.token_id for e in events] == [0] * 5
    assert events[-1].finish_reason is FinishReason.STOP
    await scheduler.stop()


async def test_abort_is_idempotent_and_frees_blocks() -> None:
    scheduler = FakeScheduler(FakeConfig(token_delay_s=0.01))
    await scheduler.start()
    stream = scheduler.submit(_request(max_tokens=1000))
    first = await anext(stream)
    assert first.token_id is not None and scheduler.kv_blocks_in_use > 0
    scheduler.abort("r0", "abort")
    scheduler.abort("r0", "abort")
    rest = await _drain(stream)
    assert rest[-1].finish_reason is FinishReason.ABORT and rest[-1].token_id is None
    assert scheduler.kv_blocks_in_use == 0 and scheduler.abort_reasons["abort"] == 1
    await scheduler.stop()


async def test_closing_the_stream_aborts(fake: FakeScheduler) -> None:
    stream = fake.submit(_request(max_tokens=40))
    await anext(stream)
    await stream.aclose()  # type: ignore[attr-defined]
    assert fake.kv_blocks_in_use == 0 and fake.num_requests == 0


async def test_too_large_and_overloaded() -> None:
    scheduler = FakeScheduler(FakeConfig(max_model_len=10, max_running=1,
                                         max_waiting_per_class=1, token_delay_s=0.05))
    await scheduler.start()
    with pytest.raises(RequestTooLarge):
        scheduler.submit(_request(prompt=[1] * 8, max_tokens=3))
    running = scheduler.submit(_request("a", max_tokens=5))
    await anext(running)
    waiting = scheduler.submit(_request("b", max_tokens=5))
    with pytest.raises(Overloaded):
        scheduler.submit(_request("c", max_tokens=5))
    scheduler.submit(_request("d", max_tokens=5, priority=Priority.LOW))  # own queue
    stats = scheduler.stats()
    assert stats.num_running == {("t", "high"): 1}
    assert stats.num_waiting == {("t", "high"): 1, ("t", "low"): 1}
    scheduler.abort("b", "abort")
    assert (await _drain(waiting))[-1].finish_reason is FinishReason.ABORT
    await scheduler.stop(drain=False)
    assert scheduler.kv_blocks_in_use == 0 and scheduler.num_requests == 0


async def test_injected_error(fake: FakeScheduler) -> None:
    scheduler = FakeScheduler(FakeConfig(error_after=2))
    await scheduler.start()
    events = await _drain(scheduler.submit(_request(max_tokens=9)))
    assert [e.finish_reason for e in events] == [None, None, FinishReason.ERROR]
    assert events[-1].error
    await scheduler.stop()


async def test_snapshot_timeline_and_drain(fake: FakeScheduler) -> None:
    stream = fake.submit(_request(max_tokens=8))
    task = asyncio.create_task(_drain(stream))
    await fake.stop(drain=True, timeout_s=5)
    assert (await task)[-1].finish_reason is FinishReason.LENGTH
    rows = fake.timeline(since=0.0)
    assert rows and {"device", "op", "class", "start", "end"} <= rows[0].keys()
    assert fake.snapshot()["devices"][0]["kv_blocks_used"] == 0
    with pytest.raises(Overloaded):
        fake.submit(_request("late"))
