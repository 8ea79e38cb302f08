"""Components: the longest context one request's KV can hold, and a limit set below it."""

from __future__ import annotations

import pytest

import models
from executors.types import Device, Priority
from models.kv_cache import KVCache
from models.sampling_params import SamplingParams
from scheduler.api import Request, RequestTooLarge
from scheduler.config import SchedulerConfig
from scheduler.scheduler import Scheduler
from tests.scheduler.conftest import linear_time, xfer_time


def _scheduler(model: models.Model, blocks: int) -> Scheduler:
    c = model.config
    per_block = KVCache.bytes_per_block(c.num_layers, 16, c.num_kv_heads, c.head_dim,
                                        model.dtype)
    cfg = SchedulerConfig(policy="slice", max_model_len=4096, max_batch_tokens=512,
                          kv_cache_bytes=blocks * per_block)
    devices = [Device("cpu:0", 256 << 20), Device("cpu:1", 256 << 20)]
    return Scheduler(model, devices, "slice", linear_time, xfer_time, cfg)


def test_the_fit_is_one_pool_above_its_watermark(tiny_model: models.Model) -> None:
    assert _scheduler(tiny_model, 40).kv_fit_tokens == 40 * 16  # 1% of 40 blocks: none
    assert _scheduler(tiny_model, 300).kv_fit_tokens == (300 - 3) * 16


async def test_a_limited_context_refuses_what_is_past_it(tiny_model: models.Model) -> None:
    sched = _scheduler(tiny_model, 40)
    with pytest.raises(ValueError, match=r"max_model_len must be in \[2, 640\]"):
        sched.limit_context(641)
    with pytest.raises(ValueError):
        sched.limit_context(1)
    sched.limit_context(640)
    assert sched.cfg.max_model_len == 640
    await sched.start()
    try:
        with pytest.raises(RequestTooLarge, match="exceeds the model's context of 640 tokens"):
            sched.submit(Request("big", "t", Priority.HIGH, [5] * 600,
                                 SamplingParams(max_tokens=41)))
        stream = sched.submit(Request("fits", "t", Priority.HIGH, [5] * 600,
                                      SamplingParams(max_tokens=40)))
        events = [ev async for ev in stream]
        assert events[-1].index == 39 and events[-1].finish_reason is not None
    finally:
        await sched.stop()
