"""`python -m scheduler bench overhead`: the scheduling path's cost over calling the chain directly.

The method of the SliceScheduler paper's Table 1: many prefills of one
request at a time, (a) the operator chain called in a loop, (b) the same
requests through Scheduler.submit (GMG, simulation, executor thread),
interleaved in blocks; medians per block.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import torch

from executors.executor import Executor, OnDone, RunOp
from executors.types import Device, Priority
from models.batch import SeqSpec, build_batch
from models.generate import run_chain
from models.kv_cache import KVCache, blocks_for
from models.loader import Model, load
from models.sampling_params import SamplingParams
from scheduler.api import Request
from scheduler.config import SchedulerConfig
from scheduler.core.scheduler import Scheduler
from scheduler.factory import build_scheduler, parse_devices

GREEDY = SamplingParams(temperature=0, max_tokens=1)


def _direct(model: Model, kv: KVCache, prompt: list[int], n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        table = kv.allocator.allocate(blocks_for(len(prompt) + 1, 16))
        seq = SeqSpec("a", prompt, 0, table, sample=True, sampling=GREEDY)
        run_chain(model, build_batch([seq], 16, model.device), kv)
        kv.allocator.free(table)
    return (time.perf_counter() - t0) / n


async def _scheduled(sched: Scheduler, prompt: list[int], n: int, block: int) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        req = Request(f"b{block}-{i}", "bench", Priority.HIGH, prompt, GREEDY)
        async for _ in sched.submit(req):
            pass
    return (time.perf_counter() - t0) / n


async def _case(model: Model, sched: Scheduler, ctx: int, total: int, block: int) -> dict:
    prompt = [(31 * j) % (model.config.vocab_size - 10) + 5 for j in range(ctx)]
    kv = model.new_kv_cache(blocks_for(ctx + 1, 16) + 1, 16)
    a, b = [], []
    for k in range(total // block):
        a.append(_direct(model, kv, prompt, block))
        b.append(await _scheduled(sched, prompt, block, k))
    ma, mb = statistics.median(a), statistics.median(b)
    return {"context": ctx, "requests": len(b) * block, "direct_s": ma, "scheduled_s": mb,
            "overhead_ratio": (mb - ma) / ma}


def one_thread(device: Device, run: RunOp, done: OnDone,
               loop: asyncio.AbstractEventLoop | None) -> Executor:
    return Executor(device, run, done, loop, intra_op_threads=1)


async def _run(model: Model, requests: int, block: int) -> list[dict]:
    devices = parse_devices("cpu:0", 2.0)
    cfg = SchedulerConfig(policy="slice", max_model_len=2048)
    sched = build_scheduler(model, devices, cfg, executor_factory=one_thread)
    await sched.start()
    try:
        return [await _case(model, sched, ctx, requests, block) for ctx in (1, 128)]
    finally:
        await sched.stop()


def main(argv: list[str] | None = None) -> dict[str, object]:
    p = argparse.ArgumentParser(prog="python -m scheduler bench overhead")
    p.add_argument("--model", default="default")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--block", type=int, default=50)
    p.add_argument("--executor", choices=("thread", "ray"), default="thread",
                   help="ray: the thread executor against a Ray actor's, side by side")
    p.add_argument("--ray-address", default=None,
                   help="with --executor ray: a cluster to join (default: a local one)")
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args(argv)
    if a.requests < 1 or a.block < 1:
        p.error("--requests and --block must be >= 1")
    a.block = min(a.block, a.requests)  # NOTE: fewer requests than a block: one block of them
    torch.set_num_threads(1)  # the executor's worker uses one intra-op thread too
    model = load(a.model, dtype=a.dtype)
    if a.executor == "ray":
        from scheduler.bench.rayhop import run_ray  # NOTE: Ray is an optional extra

        return run_ray(model, a.model, a.dtype, a.requests, a.block, a.ray_address, a.json)
    rows = asyncio.run(_run(model, a.requests, a.block))
    print("| context | requests | direct ms/req | scheduled ms/req | overhead |")
    print("|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['context']} | {r['requests']} | {r['direct_s'] * 1e3:.2f} | "
              f"{r['scheduled_s'] * 1e3:.2f} | {r['overhead_ratio']:+.2%} |")
    result: dict[str, object] = {"rows": rows,
                                 "overhead_ratio": max(r["overhead_ratio"] for r in rows)}
    if a.json:
        a.json.write_text(json.dumps(result, indent=1))
    return result
