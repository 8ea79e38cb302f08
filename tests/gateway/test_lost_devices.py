"""A device lost under the real scheduler (executors that may come back, as Ray's do): clients
see their full output, /health says degraded and names the device, /metrics has it down;
with no device left new requests get 503; a device back makes /health ok again."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from executors.executor import Executor, OnDone, RunOp
from executors.types import Device, OpInstance
from gateway.engine import engine_for_model
from models.loader import Model, load
from scheduler.config import SchedulerConfig
from scheduler.scheduler import Scheduler
from tests.gateway.harness import make_config, running
from tests.scheduler.conftest import linear_time, xfer_time

pytestmark = pytest.mark.asyncio(loop_scope="session")


class Recovering(Executor):
    """A thread executor that can be lost (its queued and next ops fail) and come back."""

    recovers = True

    def lose(self) -> None:
        with self._cond:
            self.alive = False
            left, self._pending = self._pending, []
        for op in left:
            self._fail(op, RuntimeError(f"device {self.device.name} lost"))

    def back(self) -> None:
        with self._cond:
            self.alive = True
            self._cond.notify()

    def _run(self, op: OpInstance) -> Any:
        if not self.alive:
            raise RuntimeError(f"device {self.device.name} lost")
        return super()._run(op)

    def describe(self) -> dict[str, Any]:
        return {"state": "up" if self.alive else "down"}


def _scheduler(model: Model) -> tuple[Scheduler, dict[str, Recovering]]:
    made: dict[str, Recovering] = {}

    def factory(device: Device, run_op: RunOp, on_done: OnDone, loop: Any) -> Recovering:
        made[device.name] = Recovering(device, run_op, on_done, loop)
        return made[device.name]
    # NOTE: no prefix cache: the equal prompts below would all follow the first one's cached
    # blocks to its device, and none might run on the device that is lost
    cfg = SchedulerConfig(policy="fcfs", max_model_len=256, swap_space_bytes=0,
                          prefix_caching=False)
    devs = [Device("cpu:0", 64 << 20), Device("cpu:1", 64 << 20)]
    return Scheduler(model, devs, "fcfs", linear_time, xfer_time, cfg,
                     executor_factory=factory), made


async def test_a_lost_device_delays_and_then_none_left_answers_503(tiny_model_dir: Path) -> None:
    model = load(tiny_model_dir, dtype="float32")
    sched, made = _scheduler(model)
    engine = engine_for_model(model, sched, make_config())
    async with running(make_config(), engine) as h:
        body = {"prompt": "hello there", "max_tokens": 64, "temperature": 0, "ignore_eos": True}
        want = (await h.client.post("/v1/completions", json=body)).json()["choices"][0]["text"]
        posts = [asyncio.ensure_future(h.client.post("/v1/completions", json=body))
                 for _ in range(4)]
        def midway_on_cpu1() -> bool:  # a request decoding on the device about to be lost
            return any(s.placement is not None and "cpu:1" in s.placement
                       and 0 < len(s.output_ids) < body["max_tokens"]
                       for s in sched.states.values())
        async with asyncio.timeout(60):
            while not midway_on_cpu1():
                await asyncio.sleep(0.001)
        made["cpu:1"].lose()
        for reply in await asyncio.gather(*posts):
            assert reply.status_code == 200 and reply.json()["choices"][0]["text"] == want
        assert sched.requests.dropped_tokens > 0  # recomputed on cpu:0, not failed
        assert sched.kv.pools["cpu:0"].allocator.num_used == 0
        health = await h.client.get("/health")
        assert health.status_code == 200 and health.json()["status"] == "degraded"
        assert health.json()["devices"]["cpu:1"] == {"state": "down"}
        metrics = (await h.client.get("/metrics")).text
        assert 'slicegate_device_up{device="cpu:1"} 0.0' in metrics
        made["cpu:0"].lose()
        refused = await h.client.post("/v1/completions", json=body)
        assert refused.status_code == 503 and "no device" in refused.json()["error"]["message"]
        assert (await h.client.get("/health")).status_code == 503
        made["cpu:0"].back()
        made["cpu:1"].back()
        assert (await h.client.get("/health")).json()["status"] == "ok"
        again = await h.client.post("/v1/completions", json=body)
        assert again.status_code == 200 and again.json()["choices"][0]["text"] == want
