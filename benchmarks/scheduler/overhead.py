"""`python -m benchmarks.scheduler overhead`: the scheduling path's cost over calling the chain
directly.

The method of the SliceScheduler paper's Table 1: many prefills of one
request at a time, (a) the operator chain called in a loop, (b) the same
requests through Scheduler.submit (GMG, simulation, executor thread),
interleaved in blocks; medians per block.

Both sides see the same prefix cache: off by default (every request computes its whole
prompt), or with `--prefix-cache on` both cached (the scheduler's pool caches full blocks;
the direct loop keeps the same prefix's blocks and feeds only the tail, as a hit would).
"""

from __future__ import annotations

import asyncio
import statistics
import time

import torch

from benchmarks.harness import parser, print_table, write_json
from benchmarks.scheduler.prefills import (
    CONFIG,
    CONTEXTS,
    GREEDY,
    Seen,
    config,
    one_thread,
    prompt,
    scheduled,
)
from models.batch import SeqSpec, build_batch
from models.generate import run_chain
from models.kv_cache import KVCache, blocks_for
from models.loader import Model, load
from scheduler.factory import build_scheduler, parse_devices
from scheduler.scheduler import Scheduler

BLOCK = CONFIG.block_size  # tokens per KV block


def cached_tokens(ctx: int, prefix_caching: bool) -> int:
    """Prompt tokens a repeated `ctx`-token prompt finds in the scheduler's prefix cache.

    NOTE: its full blocks but never the last token, whose hidden state the head needs."""
    return (ctx - 1) // BLOCK * BLOCK if prefix_caching else 0


def _fill(model: Model, kv: KVCache, prompt: list[int], cached: int) -> list[int]:
    """Blocks holding the first `cached` tokens' KV, computed once (untimed, as a hit is)."""
    table = kv.allocator.allocate(cached // BLOCK)
    if cached:
        seq = SeqSpec("fill", prompt[:cached], 0, table, sample=True, sampling=GREEDY)
        run_chain(model, build_batch([seq], BLOCK, model.device), kv)
    return table


def _direct(model: Model, kv: KVCache, prompt: list[int], n: int, cached: int) -> float:
    prefix = _fill(model, kv, prompt, cached)
    t0 = time.perf_counter()
    for _ in range(n):
        tail = kv.allocator.allocate(blocks_for(len(prompt) + 1, BLOCK) - len(prefix))
        seq = SeqSpec("a", prompt[cached:], cached, prefix + tail, sample=True, sampling=GREEDY)
        run_chain(model, build_batch([seq], BLOCK, model.device), kv)
        kv.allocator.free(tail)
    elapsed = time.perf_counter() - t0
    kv.allocator.free(prefix)
    return elapsed / n


async def _case(model: Model, sched: Scheduler, ctx: int, total: int, block: int) -> dict:
    ids = prompt(model, ctx)
    caching = sched.kv.prefix_caching
    kv = model.new_kv_cache(blocks_for(ctx + 1, BLOCK) + 1, BLOCK)
    direct_cached = cached_tokens(ctx, caching)
    a: list[float] = []
    b: list[float] = []
    seen = Seen()
    for k in range(total // block):
        a.append(_direct(model, kv, ids, block, direct_cached))
        b.append(await scheduled(sched, ids, block, k, seen))
    ma, mb = statistics.median(a), statistics.median(b)
    return {"context": ctx, "requests": len(b) * block, "direct_s": ma, "scheduled_s": mb,
            "overhead_ratio": (mb - ma) / ma, "direct_cached_tokens": direct_cached,
            "scheduled_cached_tokens": statistics.median(seen.cached),
            **{k: statistics.median(v) for k, v in seen.parts.items() if v}}


async def _run(model: Model, requests: int, block: int, prefix_caching: bool) -> list[dict]:
    devices = parse_devices("cpu:0", 2.0)
    sched = build_scheduler(model, devices, config(prefix_caching), executor_factory=one_thread)
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
    p.add_argument("--prefix-cache", choices=("off", "on"), default="off",
                   help="off: both sides compute every prompt in full; on: both cached")
    a = p.parse_args(argv)
    if a.requests < 1 or a.block < 1:
        p.error("--requests and --block must be >= 1")
    a.block = min(a.block, a.requests)  # NOTE: fewer requests than a block: one block of them
    torch.set_num_threads(1)  # the executor's worker uses one intra-op thread too
    model = load(a.model, dtype=a.dtype)
    if a.executor == "ray":
        from benchmarks.scheduler.rayhop import run_ray  # NOTE: Ray is an optional extra

        return run_ray(model, a.model, a.dtype, a.requests, a.block, a.ray_address, a.json)
    rows = asyncio.run(_run(model, a.requests, a.block, a.prefix_cache == "on"))
    print(f"prefix cache: {a.prefix_cache} on both sides (cached tokens per request: median)")
    print_table(["context", "requests", "direct ms/req", "scheduled ms/req", "overhead",
                 "direct cached", "scheduled cached"], "rrrrrrr",
                ([r["context"], r["requests"], f"{r['direct_s'] * 1e3:.2f}",
                  f"{r['scheduled_s'] * 1e3:.2f}", f"{r['overhead_ratio']:+.2%}",
                  r["direct_cached_tokens"], f"{r['scheduled_cached_tokens']:g}"] for r in rows))
    print("\nwhere a scheduled request's time went (ms, medians): submit to its first op, its "
          "ops (their thread's CPU), between ops, last op to submit's return")
    print_table(["context", "before 1st op", "ops", "ops' CPU", "between ops", "after last op"],
                "rrrrrr", ([r["context"], *(f"{r.get(k, float('nan')) * 1e3:.2f}" for k in (
                    "before_s", "ops_s", "ops_cpu_s", "between_s", "after_s"))] for r in rows))
    result: dict[str, object] = {"prefix_cache": a.prefix_cache, "rows": rows,
                                 "overhead_ratio": max(r["overhead_ratio"] for r in rows)}
    write_json(a.json, result)
    return result
