"""`python -m benchmarks.scheduler provisioning [--json [FILE]]`: OpScale against whole-model
scaling.

On the virtual clock (`benchmarks/scheduler/clustersim.py`), with the default
model's fitted estimators: 8 / 32 / 64 virtual devices, the Azure code trace
over its hour (rate scaled, by thinning or replicating requests, so that the
busiest minute's work fills the cluster to `--peak-util`), for `off` (every
device always on), `model` (whole-model replicas every 20 s by pending prompt
tokens) and `opscale` (operator replicas every second). Reported per run:
device-seconds in use, interactive TTFT SLO attainment, TTFT p99, time from a
plan to its new replica serving; plan time p50/p99 (wall, the planning
function the scheduler calls); the actuation of one layer group on a real CPU
device (wall); and the gap to an exhaustive oracle over static replica counts
on a small instance.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import statistics
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from benchmarks.harness import machine, machine_line, median_s, parser, write_json
from benchmarks.scheduler.clustersim import Chain, Job, OpSpec, Result, SimConfig, p_quantile
from benchmarks.scheduler.clustersim import simulate_cluster as run_sim
from executors.types import Device
from loadgen.public_traces import AZURE_CODE, require_trace
from loadgen.traces import read_azure
from models.batch import BatchShape
from models.loader import Model, load
from scheduler.config import SchedulerConfig
from scheduler.cost.estimators import Estimators
from scheduler.cost.profiling import load_or_profile
from scheduler.factory import build_scheduler
from scheduler.provisioning.planning import plan_opscale

PROG = "python -m benchmarks.scheduler provisioning"
MODES = ("off", "model", "opscale")
MODEL_UTILS = (0.6, 0.4, 0.3, 0.2)  # the model-level baseline swept to reach opscale's SLO
DECODE_BATCH = 16  # sequences per decode step the per-token decode cost assumes
DECODE_CONTEXT = 2048


def chain_of(model: Model, est: Estimators, device: str = "cpu:0") -> Chain:
    """The model's operators priced by its fitted estimators."""
    ops = []
    for t in model.template.ops:
        def prefill(tokens: int, past: int, name: str = t.name) -> float:
            ctx = past + tokens
            return est.op_time(device, name, BatchShape(tokens, 1, 1, tokens * ctx, ctx))
        b = DECODE_BATCH
        step = BatchShape(b, b, b, b * DECODE_CONTEXT, b * DECODE_CONTEXT)
        ops.append(OpSpec(t.name, t.weight_bytes, prefill,
                          est.op_time(device, t.name, step) / b,
                          t.output_bytes(BatchShape(1, 1, 1, 1, 1))))
    other = "cpu:1"
    return Chain(tuple(ops), lambda n: est.transfer_time(device, other, n))


def coarsen(chain: Chain, groups: int) -> Chain:
    """The same model with its layer groups merged into `groups` (for a small oracle)."""
    embed, *layers, head = chain.ops
    size = -(-len(layers) // groups)
    merged = []
    for k in range(0, len(layers), size):
        part = layers[k:k + size]
        def prefill(tokens: int, past: int, part: list[OpSpec] = part) -> float:
            return sum(o.prefill_s(tokens, past) for o in part)
        merged.append(OpSpec("+".join(o.name for o in part), sum(o.weight_bytes for o in part),
                             prefill, sum(o.decode_token_s for o in part),
                             part[-1].out_bytes_per_token))
    return replace(chain, ops=(embed, *merged, head))


def work_s(chain: Chain, j: Job, chunk: int = 2048) -> float:
    """Device-seconds of one request alone (its prefill chunks and its decode)."""
    total, past = 0.0, 0
    while past < j.prompt_tokens:
        n = min(chunk, j.prompt_tokens - past)
        total += sum(o.prefill_s(n, past) for o in chain.ops)
        past += n
    return total + max(0, j.output_tokens - 1) * sum(o.decode_token_s for o in chain.ops)


def scaled(jobs: list[Job], chain: Chain, devices: int, peak_util: float, seed: int = 0
           ) -> tuple[list[Job], float]:
    """Thin or replicate requests so the busiest minute's work is `peak_util` x devices."""
    per_min: dict[int, float] = {}
    for j in jobs:
        minute = int(j.arrival_s // 60)
        per_min[minute] = per_min.get(minute, 0.0) + work_s(chain, j)
    factor = devices * peak_util * 60 / max(per_min.values())
    rng = random.Random(seed)
    out = []
    for j in jobs:
        copies = int(factor) + (rng.random() < factor - int(factor))
        for c in range(copies):
            out.append(replace(j, arrival_s=j.arrival_s + (rng.random() if c else 0.0)))
    return sorted(out, key=lambda j: j.arrival_s), factor


def trace_jobs(window_s: tuple[float, float]) -> list[Job]:
    path = require_trace(AZURE_CODE, PROG)
    lo, hi = window_s
    return [Job(r.arrival_s - lo, r.prompt_tokens, r.output_tokens) for r in read_azure(path)
            if lo <= r.arrival_s < hi]


@dataclass(frozen=True, slots=True)
class Setup:
    slo_s: float
    memory_bytes: int
    peak_util: float


def evaluate(chain: Chain, jobs: list[Job], sizes: list[int], setup: Setup
             ) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, float]]]:
    """Every mode at every size; `model` also swept over the utilisation it sizes replicas
    for (`model_iso`: the cheapest that reaches `opscale`'s SLO attainment, if any does)."""
    runs: dict[str, dict[str, Any]] = {}
    plans: dict[str, dict[str, float]] = {}
    for n in sizes:
        load_jobs, factor = scaled(jobs, chain, n, setup.peak_util)
        work = sum(work_s(chain, j) for j in load_jobs)
        print(f"| {n} | (work) | {len(load_jobs)} | {work:.0f} | | | | |", flush=True)
        out: dict[str, Any] = {"work": {"device_seconds": work}}  # NOTE: what every mode runs
        runs[str(n)] = out
        for mode in MODES:
            r = run_sim(chain, load_jobs, SimConfig(mode, n, setup.memory_bytes, setup.slo_s))
            out[mode] = summary(r, factor)
            _row(n, mode, len(load_jobs), r)
            if mode == "opscale":
                plans[str(n)] = replay_plans(r, setup.slo_s)
        sweep = []
        for util in MODEL_UTILS:
            cfg = SimConfig("model", n, setup.memory_bytes, setup.slo_s, model_util=util)
            r = run_sim(chain, load_jobs, cfg)
            sweep.append((util, r))
            _row(n, f"model@{util}", len(load_jobs), r)
        reach = [(u, r) for u, r in sweep if r.slo_attainment >= out["opscale"]["slo_attainment"]]
        if reach:
            util, r = min(reach, key=lambda x: x[1].device_seconds)
            out["model_iso"] = {**summary(r, factor), "model_util": util}
        out["model_sweep"] = {str(u): summary(r, factor) for u, r in sweep}
    return runs, plans


def _row(n: int, mode: str, requests: int, r: Result) -> None:
    print(f"| {n} | {mode} | {requests} | {r.device_seconds:.0f} | {r.slo_attainment:.1%} | "
          f"{r.ttft_p99_s:.2f} | {_q(r.scale_up_s, 0.5)} / {_q(r.scale_up_s, 0.99)} | "
          f"{r.max_devices_on} |", flush=True)


def replay_plans(r: Result, slo_s: float, repeats: int = 3) -> dict[str, float]:
    """Wall ms of `plan_opscale` on every state the run planned from, replayed after the run
    (median of `repeats` per state): the plan alone, not the simulation's garbage around it."""
    times = [median_s(partial(plan_opscale, loads, cluster, slo_s, keep), repeats) * 1e3
             for loads, cluster, keep in r.plan_inputs]
    return {"p50": p_quantile(times, 0.5), "p99": p_quantile(times, 0.99), "count": len(times),
            "in_run_p50": p_quantile(r.plan_ms, 0.5), "in_run_p99": p_quantile(r.plan_ms, 0.99)}


def _q(xs: list[float], q: float) -> str:
    return f"{p_quantile(xs, q):.2f}" if xs else "-"


def summary(r: Result, factor: float) -> dict[str, float]:
    return {"device_seconds": r.device_seconds, "slo_attainment": r.slo_attainment,
            "ttft_p99_s": r.ttft_p99_s, "requests": r.num_requests, "rate_factor": factor,
            "scale_up_p50_s": p_quantile(r.scale_up_s, 0.5),
            "scale_up_p99_s": p_quantile(r.scale_up_s, 0.99),
            "max_devices_on": r.max_devices_on}


def pack(counts: tuple[int, ...], devices: int, weights: tuple[int, ...], memory: int
         ) -> dict[str, frozenset[int]] | None:
    """Static replicas by best fit: each operator's replicas on devices already in use and
    holding a neighbour first, the fullest such device first. None if they do not fit."""
    held: dict[str, set[int]] = {f"v{k}": set() for k in range(devices)}
    room = dict.fromkeys(held, memory)
    for i, c in enumerate(counts):
        for _ in range(c):
            fits = [d for d in held if i not in held[d] and room[d] >= weights[i]]
            if not fits:
                return None
            d = min(fits, key=lambda d: (not ({i - 1, i + 1} & held[d]), not held[d], room[d],
                                         d))
            held[d].add(i)
            room[d] -= weights[i]
    return {d: frozenset(v) for d, v in held.items()}


def oracle_gap(chain: Chain, jobs: list[Job], devices: int, setup: Setup
               ) -> dict[str, Any]:
    """The online plan's device-seconds against the cheapest static replica counts (every
    vector of counts, placed by best fit, on the same simulator) that reach its SLO
    attainment."""
    load_jobs, _ = scaled(jobs, chain, devices, setup.peak_util)
    online = run_sim(chain, load_jobs, SimConfig("opscale", devices, setup.memory_bytes,
                                                 setup.slo_s))
    weights = tuple(o.weight_bytes for o in chain.ops)
    best: tuple[float, tuple[int, ...], float] | None = None
    tried = 0
    for counts in itertools.product(range(1, devices + 1), repeat=len(chain.ops)):
        held = pack(counts, devices, weights, setup.memory_bytes)
        if held is None:
            continue
        used = sum(bool(v) for v in held.values())
        span = max(j.arrival_s for j in load_jobs)
        if best is not None and used * span >= best[0]:
            continue  # NOTE: a static layout costs at least its devices over the window
        tried += 1
        r = run_sim(chain, load_jobs, SimConfig("opscale", devices, setup.memory_bytes,
                                                setup.slo_s), static=held)
        if r.slo_attainment >= online.slo_attainment and (best is None
                                                           or r.device_seconds < best[0]):
            best = (r.device_seconds, counts, r.slo_attainment)
    if best is None:
        return {"gap": float("nan"), "online_device_seconds": online.device_seconds,
                "tried": tried}
    return {"gap": online.device_seconds / best[0] - 1, "online_device_seconds":
            online.device_seconds, "online_slo_attainment": online.slo_attainment,
            "oracle_device_seconds": best[0], "oracle_counts": list(best[1]),
            "oracle_slo_attainment": best[2], "devices": devices, "tried": tried,
            "requests": len(load_jobs)}


async def actuation(model: Model, est: Estimators, repeats: int) -> list[float]:
    """Wall seconds to add one layer group's replica on a real CPU device (copy + register),
    each time removed again before the next."""
    devices = [Device("cpu:0", int(1.5 * 2**30)), Device("cpu:1", int(1.5 * 2**30))]
    cfg = SchedulerConfig(max_model_len=2048, provisioning="opscale")
    sched = build_scheduler(model, devices, cfg, est)
    group = model.template.layer_groups[0].index
    for _ in range(repeats):
        await sched.actuation.add(group, "cpu:1")
        sched.actuation.remove(group, "cpu:1")
    return sched.actuation.actuation_s


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(PROG, __doc__)
    p.add_argument("--model", default="default")
    p.add_argument("--devices", default="8,32,64", help="virtual device counts")
    p.add_argument("--window-s", type=float, nargs=2, default=(0.0, 3600.0))
    p.add_argument("--slo-s", type=float, default=30.0,
                   help="interactive TTFT SLO (the default: above the longest prompt's TTFT "
                        "alone at the fitted CPU estimators)")
    p.add_argument("--peak-util", type=float, default=0.8)
    p.add_argument("--device-memory-gib", type=float, default=2.0)
    p.add_argument("--oracle-devices", type=int, default=4)
    p.add_argument("--oracle-window-s", type=float, nargs=2, default=(180.0, 420.0))
    p.add_argument("--oracle-groups", type=int, default=3)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args(argv)
    print(machine_line(), flush=True)
    model = load(a.model)
    est = load_or_profile(model, [Device("cpu:0", 2 << 30), Device("cpu:1", 2 << 30)])
    chain = chain_of(model, est)
    setup = Setup(a.slo_s, int(a.device_memory_gib * 2**30), a.peak_util)
    print(f"SLO {a.slo_s} s; busiest minute filled to {a.peak_util:.0%}\n\n"
          "| devices | mode | requests | device-s | SLO attained | TTFT p99 s | "
          "plan->serving p50 / p99 s | most devices on |\n|---:|---|---:|---:|---:|---:|---|---:|")
    runs, plans = evaluate(chain, trace_jobs(tuple(a.window_s)),
                           [int(x) for x in a.devices.split(",")], setup)
    for n, v in plans.items():
        print(f"plan time at {n} devices: p50 {v['p50']:.3f} ms, p99 {v['p99']:.3f} ms")
    gap = oracle_gap(coarsen(chain, a.oracle_groups), trace_jobs(tuple(a.oracle_window_s)),
                     a.oracle_devices, setup)
    print(f"oracle ({a.oracle_devices} devices, {a.oracle_groups} layer groups, trace "
          f"{a.oracle_window_s[0]:.0f}-{a.oracle_window_s[1]:.0f} s): {gap}")
    act = asyncio.run(actuation(model, est, a.repeats))
    act_s = statistics.median(act)
    print(f"actuation of one layer group on a real CPU device: median {act_s * 1e3:.1f} ms "
          f"over {len(act)} (max {max(act) * 1e3:.1f} ms)")
    print(machine_line())
    result: dict[str, Any] = {
        "runs": runs, "plan_ms": plans, "actuation_s": act_s, "actuation_all_s": act,
        "oracle_gap": gap["gap"], "oracle": gap, "slo_s": a.slo_s, "peak_util": a.peak_util,
        "window_s": list(a.window_s), **machine()}
    write_json(a.json, result)
    return result
