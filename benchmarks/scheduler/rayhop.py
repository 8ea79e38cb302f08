"""`python -m benchmarks.scheduler overhead --executor ray`: the actor hop's cost per operator.

One device run two ways in one process, interleaved in blocks: the thread
executor (`cpu:0`, one intra-op thread) and a Ray actor on a node of the
cluster (one intra-op thread) behind its proxy. The same single-request
prefills go through `Scheduler.submit` on each; the difference of the
medians divided by the operators per request is the extra cost per operator;
less the difference of the time spent inside the operators (the actor times
them itself), it is the hop's.
"""

from __future__ import annotations

import asyncio
import statistics
from pathlib import Path

from benchmarks.harness import machine, machine_line, print_table, write_json
from benchmarks.scheduler.prefills import CONFIG, CONTEXTS, one_thread, prompt, scheduled
from executors.ray_actor import ActorSpec
from executors.ray_cluster import ALL, RayDevices, connect, expand
from executors.ray_executor import RayExecutor
from models.loader import Model
from scheduler.factory import build_scheduler, parse_devices
from scheduler.scheduler import Scheduler

NODE = "slicegate-bench"  # the custom resource of the local node the actor is pinned to


async def _case(model: Model, thread: Scheduler, ray_sched: Scheduler, ctx: int, total: int,
                block: int) -> dict[str, float | int]:
    ids = prompt(model, ctx)
    a: list[float] = []
    b: list[float] = []
    thread_ex = next(iter(thread.exec.executors.values()))
    actor = next(iter(ray_sched.exec.executors.values()))
    assert isinstance(actor, RayExecutor)
    busy0, inside0 = thread_ex.busy_s, actor.remote_busy_s
    for k in range(total // block):
        a.append(await scheduled(thread, ids, block, 2 * k))
        b.append(await scheduled(ray_sched, ids, block, 2 * k + 1))
    ma, mb = statistics.median(a), statistics.median(b)
    n, ops = len(b) * block, len(model.template.ops)
    # NOTE: op time as each executor measured it: the thread around the call, the actor
    # inside the operator; the rest of the Ray request's time is the hop and the proxy
    thread_op, actor_op = (thread_ex.busy_s - busy0) / n, (actor.remote_busy_s - inside0) / n
    return {"context": ctx, "requests": n, "ops_per_request": ops,
            "thread_s": ma, "ray_s": mb, "ratio": mb / ma, "per_op_s": (mb - ma) / ops,
            "thread_op_s": thread_op, "actor_op_s": actor_op,
            "hop_per_op_s": (mb - actor_op - (ma - thread_op)) / ops}


async def _run(model: Model, remote: RayDevices, requests: int, block: int) -> list[dict]:
    thread = build_scheduler(model, parse_devices("cpu:0", 2.0), CONFIG,
                             executor_factory=one_thread)
    ray_sched = build_scheduler(model, remote.devices, CONFIG, executor_factory=remote.factory)
    for sched in (thread, ray_sched):
        # NOTE: the actor's ops take longer than profiled (the hop), which reads as drift;
        # a background re-profile would then load the CPU in the middle of the comparison
        sched.profiler = None
        sched.estimator.freeze()
        sched.estimator.on_drift = None
    await thread.start()
    await ray_sched.start()
    try:
        return [await _case(model, thread, ray_sched, ctx, requests, block) for ctx in CONTEXTS]
    finally:
        await ray_sched.stop()
        await thread.stop()


def run_ray(model: Model, spec: str, dtype: str, requests: int, block: int,
            address: str | None, out: Path | None) -> dict[str, object]:
    print(machine_line(), flush=True)
    if address is None:
        connect(None, num_cpus=2, resources={NODE: 1}, include_dashboard=False)
        name = f"{NODE}/cpu:0"
    else:
        connect(address)
        name = expand([ALL])[0]  # the first device of the cluster
    remote = RayDevices.start([name], 2 << 30, ActorSpec(
        spec, dtype, model.template.layers_per_group, "cpu:0", 1, model.kernels.to_dict()))
    try:
        rows = asyncio.run(_run(model, remote, requests, block))
    finally:
        remote.close()
    print_table(["context", "requests", "ops/request", "thread ms/req", "ray actor ms/req",
                 "ratio", "extra per op", "ops in thread ms/req", "ops in actor ms/req",
                 "hop per op"], "r" * 10,
                ([r["context"], r["requests"], r["ops_per_request"], f"{r['thread_s'] * 1e3:.2f}",
                  f"{r['ray_s'] * 1e3:.2f}", f"{r['ratio']:.2f}x", f"{r['per_op_s'] * 1e3:.2f} ms",
                  f"{r['thread_op_s'] * 1e3:.2f}", f"{r['actor_op_s'] * 1e3:.2f}",
                  f"{r['hop_per_op_s'] * 1e3:.2f} ms"] for r in rows))
    print(machine_line())
    result: dict[str, object] = {"rows": rows, **machine(), "ratio": max(r["ratio"] for r in rows)}
    write_json(out, result)
    return result
