"""`slice` packs low-priority prompts into one plan per device, within the chunk budget.

Fake executors on a virtual clock (1 ms per op + 0.1 ms per token, see conftest).
"""

from __future__ import annotations

import asyncio

import torch

import models
from executors.fake import VirtualCluster
from executors.types import Device, OpInstance, Priority
from models.sampling_params import SamplingParams
from scheduler.api import Request
from scheduler.config import SchedulerConfig
from scheduler.scheduler import Scheduler
from tests.scheduler.conftest import linear_time, xfer_time


def _fake_run(op: OpInstance) -> torch.Tensor | None:
    return torch.zeros(op.shape.num_sampled, dtype=torch.long) if op.name == "head" else None


async def _run(sched: Scheduler, cluster: VirtualCluster, n: int, prompt: int
               ) -> list[tuple[int, int]]:
    """Submit `n` low-priority requests at once, run them out; (seqs, tokens) of each embed."""
    seen: dict[int, tuple[int, int]] = {}
    await sched.start()
    params = SamplingParams(max_tokens=2, temperature=0)

    async def consume(i: int) -> int:
        req = Request(f"lp{i}", "batch", Priority.LOW, [3 + i] * prompt, params,
                      arrival_time=0.0)
        return len([ev async for ev in sched.submit(req)])

    tasks = [asyncio.create_task(consume(i)) for i in range(n)]
    while True:
        for _ in range(20):
            await asyncio.sleep(0)
        for op in sched.gmg.scheduled.values():
            if op.name == "embed" and op.shape.num_sampled:
                seen[op.op_id] = (op.shape.num_seqs, op.shape.num_tokens)
        if not cluster.step():
            break
    counts = await asyncio.gather(*tasks)
    await sched.stop(drain=False)
    assert counts == [2] * n
    return list(seen.values())


def _cluster_scheduler(model: models.Model, slo_s: float = 1.0
                       ) -> tuple[Scheduler, VirtualCluster]:
    cluster = VirtualCluster()
    cfg = SchedulerConfig(policy="slice", max_model_len=1024, max_batch_tokens=512,
                          default_ttft_slo_s=slo_s)
    devs = [Device("cpu:0", 256 << 20), Device("cpu:1", 256 << 20)]
    sched = Scheduler(model, devs, "slice", linear_time, xfer_time, cfg, clock=cluster.clock,
                      executor_factory=lambda d, run, done, loop: cluster.add(
                          d, done, run_op=_fake_run))
    return sched, cluster


async def test_waiting_low_prompts_share_one_plan(tiny_model: models.Model) -> None:
    sched, cluster = _cluster_scheduler(tiny_model)
    embeds = await _run(sched, cluster, 8, 100)
    prefills = [e for e in embeds if e[1] > e[0]]  # more tokens than sequences: prefill
    assert max(seqs for seqs, _ in prefills) > 1
    assert all(tokens <= 512 for _, tokens in prefills)  # max_batch_tokens


async def test_low_plans_stay_within_the_slo_budget(tiny_model: models.Model) -> None:
    # 10% of a 50 ms SLO = 5 ms per layer group = 40 tokens at 0.1 ms per token + 1 ms
    sched, cluster = _cluster_scheduler(tiny_model, slo_s=0.05)
    embeds = await _run(sched, cluster, 4, 100)
    prefill_tokens = [tokens for seqs, tokens in embeds if tokens > seqs]
    assert prefill_tokens and max(prefill_tokens) == 40
