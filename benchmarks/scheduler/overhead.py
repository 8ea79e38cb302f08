"""`python -m benchmarks.scheduler overhead`: the scheduling path's cost over calling the chain
directly.

The method of the SliceScheduler paper's Table 1: many prefills of one
request at a time, (a) the operator chain called in a loop, (b) the same
requests through Scheduler.submit (GMG, simulation, executor thread),
interleaved in blocks; medians per block.
"""

from __future__ import annotations

import asyncio
import statistics
import time

import torch

from benchmarks.harness import parser, print_table, write_json
from benchmarks.scheduler.prefills import CONFIG, CONTEXTS, GREEDY, one_thread, prompt, scheduled
from models.batch import SeqSpec, build_batch
from models.generate import run_chain
from models.kv_cache import KVCache, blocks_for
from models.loader import Model, load
from scheduler.factory import build_scheduler, parse_devices
from scheduler.scheduler import Scheduler


def _direct(model: Model, kv: KVCache, prompt: list[int], n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        table = kv.allocator.allocate(blocks_for(len(prompt) + 1, 16))
        seq = SeqSpec("a", prompt, 0, table, sample=True, sampling=GREEDY)
        run_chain(model, build_batch([seq], 16, model.device), kv)
        kv.allocator.free(table)
    return (time.perf_counter() - t0) / n


async def _case(model: Model, sched: Scheduler, ctx: int, total: int, block: int) -> dict:
    ids = prompt(model, ctx)
    kv = model.new_kv_cache(blocks_for(ctx + 1, 16) + 1, 16)
    a, b = [], []
    for k in range(total // block):
        a.append(_direct(model, kv, ids, block))
        b.append(await scheduled(sched, ids, block, k))
    ma, mb = statistics.median(a), statistics.median(b)
    return {"context": ctx, "requests": len(b) * block, "direct_s": ma, "scheduled_s": mb,
            "overhead_ratio": (mb - ma) / ma}


async def _run(model: Model, requests: int, block: int) -> list[dict]:
    devices = parse_devices("cpu:0", 2.0)
    sched = build_scheduler(model, devices, CONFIG, executor_factory=one_thread)
    await sched.start()
    try:
        return [await _case(model, sched, ctx, requests, block) for ctx in CONTEXTS]
    finally:
        await sched.stop()


def main(argv: list[str] | None = None) -> dict[str, object]:
    p = parser("python -m benchmarks.scheduler overhead", __doc__)
    p.add_argument("--model", default="default")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--block", type=int, default=50)
    p.add_argument("--executor", choices=("thread", "ray"), default="thread",
                   help="ray: the thread executor against a Ray actor's, side by side")
    p.add_argument("--ray-address", default=None,
                   help="with --executor ray: a cluster to join (default: a local one)")
    a = p.parse_args(argv)
    if a.requests < 1 or a.block < 1:
        p.error("--requests and --block must be >= 1")
    a.block = min(a.block, a.requests)  # NOTE: fewer requests than a block: one block of them
    torch.set_num_threads(1)  # the executor's worker uses one intra-op thread too
    model = load(a.model, dtype=a.dtype)
    if a.executor == "ray":
        from benchmarks.scheduler.rayhop import run_ray  # NOTE: Ray is an optional extra

        return run_ray(model, a.model, a.dtype, a.requests, a.block, a.ray_address, a.json)
    rows = asyncio.run(_run(model, a.requests, a.block))
    print_table(["context", "requests", "direct ms/req", "scheduled ms/req", "overhead"],
                "rrrrr", ([r["context"], r["requests"], f"{r['direct_s'] * 1e3:.2f}",
                           f"{r['scheduled_s'] * 1e3:.2f}", f"{r['overhead_ratio']:+.2%}"]
                          for r in rows))
    result: dict[str, object] = {"rows": rows,
                                 "overhead_ratio": max(r["overhead_ratio"] for r in rows)}
    write_json(a.json, result)
    return result
