"""What a client sees when the real scheduler's rounds fail: 500 / an SSE error, honest /health."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from executors.types import Device
from gateway.engine import engine_for_model
from models.loader import Model, load
from scheduler.config import SchedulerConfig
from scheduler.round.decision import RoundDecision
from scheduler.round.view import RoundView
from scheduler.scheduler import Scheduler
from tests.gateway.harness import make_config, running, sse_events
from tests.scheduler.conftest import linear_time, xfer_time

pytestmark = pytest.mark.asyncio(loop_scope="session")


def _scheduler(model: Model, broken: list[bool]) -> Scheduler:
    cfg = SchedulerConfig(policy="slice", max_model_len=256)
    sched = Scheduler(model, [Device("cpu:0", 64 << 20)], "slice", linear_time, xfer_time, cfg)
    real = sched.policy.schedule

    def schedule(view: RoundView) -> RoundDecision:
        if broken[0]:
            raise RuntimeError("injected round failure")
        return real(view)
    sched.policy.schedule = schedule  # type: ignore[method-assign]
    return sched


async def test_failing_rounds_answer_server_errors_and_health_tells(tiny_model_dir: Path) -> None:
    broken = [True]
    model = load(tiny_model_dir, dtype="float32")
    engine = engine_for_model(model, _scheduler(model, broken), make_config())
    async with running(make_config(), engine) as h:
        body = {"prompt": "hello there", "max_tokens": 4}
        plain = await h.client.post("/v1/completions", json=body)
        assert plain.status_code == 500
        error = plain.json()["error"]
        assert error["type"] == "server_error" and "injected round failure" in error["message"]
        streamed = await h.client.post("/v1/completions", json={**body, "stream": True})
        events = sse_events(streamed.text)
        assert streamed.status_code == 200 and events[-1] == "[DONE]"
        assert events[-2]["error"]["type"] == "server_error"
        health = await h.client.get("/health")
        assert health.status_code == 503 and "injected round failure" in health.json()["detail"]
        metrics = (await h.client.get("/metrics")).text
        assert "slicegate_scheduler_errors_total" in metrics
        broken[0] = False
        ok = await h.client.post("/v1/completions", json=body)
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 4
        for _ in range(100):
            if (await h.client.get("/health")).status_code == 200:
                break
            await asyncio.sleep(0.01)
        assert (await h.client.get("/health")).json() == {"status": "ok"}
