"""A low-priority flood cannot push a high-priority request past a feasible TTFT deadline.

Fake executors on a virtual clock: ops take exactly their estimated time, so
the scenario is deterministic and needs no model compute.
"""

from __future__ import annotations

import asyncio

import torch

import models
from executors.fake import VirtualCluster
from executors.types import OpInstance, Priority
from models.sampling_params import SamplingParams
from scheduler.api import Request
from tests.scheduler.conftest import make_scheduler

SLO_S = 0.15
HP_ARRIVALS = [0.05 + 0.2 * i for i in range(15)]


def _fake_run(op: OpInstance) -> torch.Tensor | None:
    return torch.zeros(op.shape.num_sampled, dtype=torch.long) if op.name == "head" else None


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def _scenario(model: models.Model, policy: str) -> list[float]:
    cluster = VirtualCluster()
    sched = make_scheduler(model, policy, clock=cluster.clock,
                           executor_factory=lambda d, run, done, loop: cluster.add(
                               d, done, run_op=_fake_run))
    await sched.start()
    ttfts: list[float] = []

    async def consume(req: Request) -> None:
        async for ev in sched.submit(req):
            if ev.index == 0 and ev.token_id is not None:
                ttfts.append(cluster.now - req.arrival_time)

    lp = SamplingParams(max_tokens=20, temperature=0)
    tasks = [asyncio.create_task(consume(Request(f"lp{i}", "batch", Priority.LOW,
                                                 [3 + i] * 500, lp, arrival_time=0.0)))
             for i in range(40)]
    for i, t in enumerate(HP_ARRIVALS):
        await _settle()
        while (nxt := cluster.next_time()) is not None and nxt <= t:
            cluster.step()
            await _settle()
        cluster.run_until(t)
        hp = Request(f"hp{i}", "ide", Priority.HIGH, [7 + i] * 200,
                     SamplingParams(max_tokens=4, temperature=0), ttft_slo_s=SLO_S,
                     arrival_time=t)
        tasks.append(asyncio.create_task(consume(hp)))
    await _settle()
    while cluster.step():
        await _settle()
    await asyncio.gather(*tasks)
    await sched.stop(drain=False)
    assert len(ttfts) == 40 + len(HP_ARRIVALS)
    return [sched.books.slo[Priority.HIGH].met, sched.books.slo[Priority.HIGH].with_slo]


async def test_slice_keeps_every_high_priority_deadline(tiny_model: models.Model) -> None:
    met, total = await _scenario(tiny_model, "slice")
    assert (met, total) == (len(HP_ARRIVALS), len(HP_ARRIVALS))


async def test_fcfs_misses_them_in_the_same_scenario(tiny_model: models.Model) -> None:
    met, total = await _scenario(tiny_model, "fcfs")
    assert total == len(HP_ARRIVALS) and met < total
