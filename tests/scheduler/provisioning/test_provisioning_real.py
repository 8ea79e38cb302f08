"""OpScale on real devices: the default model on cpu:0,cpu:1 (weights copied, ops run there)."""

import asyncio
import time
from pathlib import Path

import models
from executors.types import Device, Priority
from models.generate import generate
from models.sampling_params import SamplingParams
from scheduler.api import FinishReason, Request
from scheduler.config import SchedulerConfig
from scheduler.factory import build_scheduler
from scheduler.memory.replicas import ReplicaState
from scheduler.scheduler import Scheduler
from tests.scheduler.conftest import stream

PARAMS = SamplingParams(temperature=0, max_tokens=6)


async def collect(sched: Scheduler, rid: str, prompt: list[int]) -> tuple[list[int], object]:
    req = Request(rid, "t", Priority.HIGH, prompt, PARAMS, ttft_slo_s=30.0,
                  arrival_time=time.monotonic())
    out = await stream(sched, req)
    return out.tokens, out.finish


async def until(cond: object, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_busiest_group_is_replicated_under_load_and_removed_after(
        default_model_dir: Path) -> None:
    model = models.load(str(default_model_dir), dtype="float32")
    devices = [Device("cpu:0", int(1.5 * 2**30)), Device("cpu:1", int(1.5 * 2**30))]
    cfg = SchedulerConfig(max_model_len=1024, max_batch_tokens=256, provisioning="opscale",
                          provision_interval_s=3600)  # NOTE: ticks driven by the test
    sched = build_scheduler(model, devices, cfg)
    sched.demand.window_s = sched.demand.keep_window_s = 2.0
    prov = sched.provisioner
    assert prov is not None
    prompts = [[1 + (7 * i + 3 * j) % 4000 for j in range(256 + 16 * i)] for i in range(8)]
    want = [generate(model, p, PARAMS).token_ids for p in prompts]
    await sched.start()
    try:
        first = [asyncio.create_task(collect(sched, f"a{i}", p)) for i, p in enumerate(prompts)]
        await until(lambda: len(sched.demand.issued) > 0)
        await asyncio.sleep(0.05)
        loads = prov.loads(sched.clock())
        busiest = max(range(1, len(loads) - 1), key=lambda i: loads[i].erlangs)
        plan = prov.tick(sched.clock())
        assert plan is not None and any(a.index == busiest and a.device == "cpu:1"
                                        for a in plan.adds), plan
        await until(lambda: sched.replicas.state(busiest, "cpu:1") is ReplicaState.READY)
        second = [asyncio.create_task(collect(sched, f"b{i}", p)) for i, p in enumerate(prompts)]
        got = await asyncio.gather(*first, *second)
        assert [t for t, _ in got] == want + want  # identical greedy tokens throughout
        assert all(f is FinishReason.LENGTH for _, f in got)  # none lost
        assert sched.actuation.actuation_s and sched.actuation.failures == 0

        await asyncio.sleep(2.5)  # the load is gone from both windows
        down = prov.tick(sched.clock())
        assert down is not None and any(r.index == busiest and r.device == "cpu:1"
                                        for r in down.removes), down
        await until(lambda: sched.replicas.state(busiest, "cpu:1") is None)
        assert "cpu:1" in sched.replicas.idle_devices(sched.devices)
        assert sched.ledgers["cpu:1"].used("weights") == 0
        assert not sched.exec.runner.replica_ops
        after = await collect(sched, "c0", prompts[0])
        assert after == (want[0], FinishReason.LENGTH)
    finally:
        await sched.stop()


async def test_copied_weights_serve_identical_tokens(tiny_model: models.Model) -> None:
    """A whole replica copied onto cpu:1 (its own tensors) serves what the original does."""
    devices = [Device("cpu:0", 256 << 20), Device("cpu:1", 256 << 20)]
    cfg = SchedulerConfig(max_model_len=1024, max_batch_tokens=256, provisioning="opscale",
                          provision_interval_s=3600)
    sched = build_scheduler(tiny_model, devices, cfg)
    prompts = [[1 + (5 * i + j) % 200 for j in range(40 + 8 * i)] for i in range(6)]
    want = [generate(tiny_model, p, PARAMS).token_ids for p in prompts]
    await sched.start()
    try:
        for i in range(len(tiny_model.template.ops)):
            await sched.actuation.add(i, "cpu:1")
        copies = sched.exec.runner.replica_ops
        src = tiny_model.ops[1].layers[0].input_norm  # type: ignore[union-attr]
        assert copies[("cpu:1", 1)].layers[0].input_norm.data_ptr() != src.data_ptr()
        got = await asyncio.gather(*[collect(sched, f"r{i}", p) for i, p in enumerate(prompts)])
        assert [t for t, _ in got] == want
        assert {e["device"] for e in sched.timeline(0.0)} == {"cpu:0", "cpu:1"}
    finally:
        await sched.stop()
