"""Single-request prefills through a scheduler, timed: what `overhead` and its Ray variant
(`rayhop`) share. Each request is one greedy token of a fixed prompt, submitted when the one
before it has ended."""

from __future__ import annotations

import asyncio
import dataclasses
import time

from executors.executor import Executor, OnDone, RunOp
from executors.types import Device, Priority
from models.loader import Model
from models.sampling_params import SamplingParams
from scheduler.api import Request
from scheduler.config import SchedulerConfig
from scheduler.scheduler import Scheduler

GREEDY = SamplingParams(temperature=0, max_tokens=1)
CONFIG = SchedulerConfig(policy="slice", max_model_len=2048)
CONTEXTS = (1, 128)  # prompt tokens of the two cases


def config(prefix_caching: bool) -> SchedulerConfig:
    """CONFIG with the prefix cache on or off."""
    return dataclasses.replace(CONFIG, prefix_caching=prefix_caching)


def prompt(model: Model, ctx: int) -> list[int]:
    """`ctx` token ids, none of them special."""
    return [(31 * j) % (model.config.vocab_size - 10) + 5 for j in range(ctx)]


async def scheduled(sched: Scheduler, prompt: list[int], n: int, block: int,
                    cached: list[int] | None = None) -> float:
    """Seconds per request of `n` requests through `sched.submit`, one after another.

    `cached`, if given, receives each request's prompt tokens found in the prefix cache."""
    t0 = time.perf_counter()
    for i in range(n):
        req = Request(f"b{block}-{i}", "bench", Priority.HIGH, prompt, GREEDY)
        async for event in sched.submit(req):
            if cached is not None and event.finish_reason is not None:
                cached.append(event.num_cached_tokens)
    return (time.perf_counter() - t0) / n


def one_thread(device: Device, run: RunOp, done: OnDone,
               loop: asyncio.AbstractEventLoop | None) -> Executor:
    """A thread executor with one intra-op thread (the direct loop's torch uses one too)."""
    return Executor(device, run, done, loop, intra_op_threads=1)
