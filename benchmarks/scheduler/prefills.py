"""Single-request prefills through a scheduler, timed: what `overhead` and its Ray variant
(`rayhop`) share. Each request is one greedy token of a fixed prompt, submitted when the one
before it has ended."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass, field

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


@dataclass(slots=True)
class Seen:
    """Per scheduled request: prompt tokens found in the prefix cache, and where its time went
    (seconds, from `Scheduler.timeline`): from submit to its first op's start, its ops, between
    them, from its last op's end to `submit`'s return, and its ops' executor-thread CPU time."""

    cached: list[int] = field(default_factory=list)
    parts: dict[str, list[float]] = field(default_factory=lambda: {
        k: [] for k in ("before_s", "ops_s", "ops_cpu_s", "between_s", "after_s")})

    def add(self, sched: Scheduler, rid: str, submitted: float, returned: float) -> None:
        ops = [e for e in sched.timeline(submitted) if rid in e["requests"]]
        if not ops:
            return
        first, last = min(e["start"] for e in ops), max(e["end"] for e in ops)
        busy = sum(e["end"] - e["start"] for e in ops)
        for k, v in (("before_s", first - submitted), ("ops_s", busy),
                     ("ops_cpu_s", sum(e["cpu"] or 0.0 for e in ops)),
                     ("between_s", last - first - busy), ("after_s", returned - last)):
            self.parts[k].append(v)


async def scheduled(sched: Scheduler, prompt: list[int], n: int, block: int,
                    seen: Seen | None = None) -> float:
    """Seconds per request of `n` requests through `sched.submit`, one after another.

    `seen`, if given, receives each request's cached tokens and the split of its time."""
    t0 = time.perf_counter()
    for i in range(n):
        req = Request(f"b{block}-{i}", "bench", Priority.HIGH, prompt, GREEDY)
        submitted = time.monotonic()
        async for event in sched.submit(req):
            if seen is not None and event.finish_reason is not None:
                seen.cached.append(event.num_cached_tokens)
        if seen is not None:
            seen.add(sched, req.request_id, submitted, time.monotonic())
    return (time.perf_counter() - t0) / n


def one_thread(device: Device, run: RunOp, done: OnDone,
               loop: asyncio.AbstractEventLoop | None) -> Executor:
    """A thread executor with one intra-op thread (the direct loop's torch uses one too)."""
    return Executor(device, run, done, loop, intra_op_threads=1)
