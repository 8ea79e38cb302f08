from __future__ import annotations

import dataclasses
import re

import pytest

import models
from executors.types import Device
from models.batch import BatchShape
from scheduler.api import FinishReason, Request
from scheduler.config import SchedulerConfig
from scheduler.cost import firstrows
from scheduler.scheduler import Scheduler


def linear_time(device: str, name: str, shape: BatchShape) -> float:
    """A cost model for tests: 1 ms per op plus 0.1 ms per token."""
    return 1e-3 + 1e-4 * shape.num_tokens


def layered_time(device: str, name: str, shape: BatchShape) -> float:
    """A cost model that sees layers, for operator granularity: a layer group takes 1 ms
    plus 25 us per token and layer; the embedding and the head 0.5 ms plus 1 us per token."""
    if m := re.fullmatch(r"layers\[(\d+):(\d+)\]", name):
        return 1e-3 + 25e-6 * shape.num_tokens * (int(m[2]) - int(m[1]))
    return 5e-4 + 1e-6 * shape.num_tokens


def xfer_time(src: str, dst: str, num_bytes: int) -> float:
    return 1e-4


@pytest.fixture(autouse=True)
def fresh_first_rows() -> None:
    """Each test starts as a fresh process would: no row counts run, no ratio learnt."""
    firstrows.PROCESS.reset()


@pytest.fixture(scope="session")
def tiny_model() -> models.Model:
    return models.load("tiny-random", dtype="float32")


def make_scheduler(model: models.Model, policy: str, mem: int = 256 << 20,
                   **kw: object) -> Scheduler:
    devs = [Device("cpu:0", mem), Device("cpu:1", mem)]
    cfg = SchedulerConfig(policy=policy, max_model_len=1024, max_batch_tokens=512)
    return Scheduler(model, devs, policy, linear_time, xfer_time, cfg, **kw)  # type: ignore[arg-type]


@dataclasses.dataclass
class Streamed:
    """What one request's stream brought: its tokens, how it ended, and its cached prompt
    tokens (as its last event counts them; -1: no event)."""

    tokens: list[int]
    finish: FinishReason | None = None
    num_cached: int = -1


async def stream(sched: Scheduler, request: Request) -> Streamed:
    """Submit `request` and read its stream to the end."""
    out = Streamed([])
    async for ev in sched.submit(request):
        if ev.token_id is not None:
            out.tokens.append(ev.token_id)
        out.finish, out.num_cached = ev.finish_reason, ev.num_cached_tokens
    return out
