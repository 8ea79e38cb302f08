"""`python -m benchmarks.scheduler simulator`: simulation speed, round decision time, accuracy.

Speed is measured on synthetic snapshots twice: with no interference model, and with
every device on one host and each op class slowed by each other class by its own factor
(`SYNTHETIC_SLOWDOWN`: the fluid co-location path a live `cpu:0` + `cpu:1` deployment
takes once profiling measured slowdowns; factors that differ by class make ops re-time
as the classes running beside them change), each through the C loop the scheduler runs
(`scheduler.sim.native`) and through the Python loops beside it. The round replay and the
accuracy run use the profiled model.
"""

from __future__ import annotations

import asyncio
import gc
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from benchmarks.harness import machine, machine_line, parser, print_table, write_json
from benchmarks.scheduler.policies import Workload, run_policy
from executors.interference import OP_CLASSES, Interference
from executors.types import Device, OpInstance, OpRole, Priority
from models.batch import BatchShape
from models.loader import Model, load
from models.sampling_params import SamplingParams
from scheduler.api import Request
from scheduler.config import SchedulerConfig
from scheduler.core.state import RequestState
from scheduler.cost.estimators import Estimators
from scheduler.cost.profiling import load_or_profile
from scheduler.factory import build_scheduler, parse_devices
from scheduler.memory.kv import KVManager
from scheduler.policies.common import split
from scheduler.policies.slice import SlicePolicy
from scheduler.round.decision import Admission, RoundDecision
from scheduler.round.plan import Feed, Plan, to_candidate
from scheduler.round.view import RoundView
from scheduler.scheduler import Scheduler
from scheduler.sim import native as simloop
from scheduler.sim.gmg import GMG, Snapshot
from scheduler.sim.simulator import simulate
from scheduler.sim.types import Candidate, Prediction

SHAPE = BatchShape(64, 4, 4, 4096, 256)
CHAIN = ("embed", *(f"layers[{5 * k}:{5 * k + 5}]" for k in range(6)), "head")  # a plan's ops
_SENSITIVE = {"embed": 0.1, "layers": 0.5, "head": 0.2, "send": 0.05}  # how much it slows
_HEAVY = {"embed": 0.5, "layers": 1.0, "head": 0.6, "send": 0.3}  # how much it slows others
SYNTHETIC_SLOWDOWN = {(a, b): 1.0 + _SENSITIVE[a] * _HEAVY[b] for a in OP_CLASSES
                      for b in OP_CLASSES}


def synthetic_gmg(num_devices: int, num_ops: int, seed: int = 0,
                  shared: bool = False) -> GMG:
    """Chains of 8 ops (a plan each) over random devices, mixed priorities, all issued;
    `shared`: every device on one host, each op class slowed by the others'."""
    from executors.memory import MemoryLedger
    rng = random.Random(seed)
    devs = {f"cpu:{i}": Device(f"cpu:{i}", 1 << 40) for i in range(num_devices)}
    gmg = GMG(devs, {d: MemoryLedger(1 << 40) for d in devs}, KVManager({}))
    ops: list[OpInstance] = []
    while len(ops) < num_ops:
        prio, prev = rng.choice(list(Priority)), None
        dev = f"cpu:{rng.randrange(num_devices)}"
        for i, name in enumerate(CHAIN):
            op = OpInstance(len(ops), name, OpRole.COMPUTE, i, dev, prio, SHAPE, ("r",),
                            deps=(prev,) if prev else (), est_s=rng.uniform(1e-3, 2e-2),
                            issued_at=0.0)
            ops.append(op)
            prev = op
    gmg.add(ops, {})
    for op in ops:
        gmg.mark_issued(op)
    if shared:
        gmg.interference = Interference(dict.fromkeys(devs, "host"), SYNTHETIC_SLOWDOWN)
    return gmg


def speed(devices: list[int], num_ops: int, repeats: int, shared: bool = False,
          native: bool = True) -> dict[str, float]:
    """Simulated ops per millisecond (median of `repeats`) per device count; `native`
    False: the Python loops (`simulate(native=False)`), not the C loop.

    NOTE: each repeat simulates a fresh snapshot, so the time includes building its graph
    (a round builds it once and shares it among its candidates)."""
    out = {}
    for n in devices:
        gmg = synthetic_gmg(n, num_ops, shared=shared)
        times = []
        for _ in range(repeats):
            snap = gmg.snapshot(0.0)
            t0 = time.perf_counter()
            simulate(snap, native=native)
            times.append(time.perf_counter() - t0)
        out[str(n)] = len(snap.ops) / (statistics.median(times) * 1e3)
    return out


SIZES = [(512, "cpu:0"), (128, "cpu:1"), (256, "cpu:0"), (384, "cpu:1"), (64, "cpu:0"),
         (320, "split"), (200, "cpu:1"), (96, "cpu:0")]  # (prompt tokens, placement)
CALIBRATION = [(448, "cpu:1"), (160, "cpu:0"), (288, "cpu:1"), (352, "cpu:0"), (80, "cpu:1"),
               (256, "split"), (224, "cpu:0"), (112, "cpu:1")]  # a different mix


async def _workload(sched: Scheduler, tag: str, sizes: list[tuple[int, str]] = SIZES
                    ) -> tuple[list[float], list[float], dict[str, float]]:
    """Predict the mixed batch workload, then run it: (predicted, actual) finish per request,
    and the measured-over-predicted time per op kind (`op_ratios`)."""
    n_ops, plans = len(sched.model.template.ops), []
    for i, (n, where) in enumerate(sizes):
        prompt = [(31 * j + i) % 40000 + 5 for j in range(n)]
        st = RequestState(Request(f"{tag}{i}", "bench", list(Priority)[i % 3], prompt,
                                  SamplingParams(temperature=0, max_tokens=1)), [])
        at = 1 + (n_ops - 2) // 2
        placement = (where,) * n_ops if where != "split" else split("cpu:0", "cpu:1", at, n_ops)
        sched.requests.add(st)
        sched.requests.admit(Admission(st.rid, placement, n + 1))
        plan = Plan(st.priority, placement, [[Feed(st.view(), 0, n)]])
        plans.append(sched.builder.build(plan))
    now = time.monotonic()
    merged = Candidate(tuple(o for p in plans for o in to_candidate(p, {}).ops))
    pred = simulate(sched.gmg.snapshot(now), merged)
    predicted = [pred.finish[p.finals[-1].op_id] - now for p in plans]
    t0 = time.monotonic()
    for p in plans:
        sched._issue(p, now)  # NOTE: the very ops that were predicted
    for _ in range(6000):
        if all(not s.in_flight for s in sched.states.values()):
            break
        await asyncio.sleep(0.005)
    actual = [p.finals[-1].end - t0 for p in plans]  # type: ignore[operator]
    ops = [o for p in plans for o in p.ops]
    return predicted, actual, {**op_ratios(pred, ops), **idle_gaps(pred, ops), **cpu_share(ops)}


def op_ratios(pred: Prediction, ops: list[OpInstance]) -> dict[str, float]:
    """Per op kind ("embed", "layers", "head", "send", "recv"), the measured time over the
    predicted, summed over its ops (time-weighted: what a schedule feels): above 1, the
    simulation thought that kind faster than it ran."""
    spent: dict[str, list[float]] = {}
    for o in ops:
        if o.start is not None and o.end is not None and o.op_id in pred.finish:
            kind = o.name.split("[")[0]
            sums = spent.setdefault(f"op_ratio_{kind}", [0.0, 0.0])
            sums[0] += o.end - o.start
            sums[1] += pred.finish[o.op_id] - pred.start[o.op_id]
    return {k: a / p for k, (a, p) in sorted(spent.items()) if p > 0}


def idle_gaps(pred: Prediction, ops: list[OpInstance]) -> dict[str, float]:
    """Seconds each device sat idle between its first op's start and its last op's end,
    summed over devices, as run (`gap_actual_s`) and as predicted (`gap_predicted_s`).

    NOTE: the simulator starts an op the moment its inputs are done and its device is free;
    a run pays the hand-offs between ops (the completion back to the scheduler, the next op's
    dispatch, a thread's wake-up). Gaps measured well above the predicted ones are a cost
    the model leaves out; equal ones put the error in the ops' own times."""
    actual, predicted = [], []
    for o in ops:
        if o.start is not None and o.end is not None and o.op_id in pred.finish:
            actual.append((o.device, o.start, o.end))
            predicted.append((o.device, pred.start[o.op_id], pred.finish[o.op_id]))
    return {"gap_actual_s": _gaps(actual), "gap_predicted_s": _gaps(predicted)}


def _gaps(spans: list[tuple[str, float, float]]) -> float:
    by_device: dict[str, list[tuple[float, float]]] = {}
    for device, a, b in spans:
        by_device.setdefault(device, []).append((a, b))
    idle = 0.0
    for runs in by_device.values():
        runs.sort()
        reach = runs[0][1]
        for a, b in runs[1:]:
            idle += max(0.0, a - reach)
            reach = max(reach, b)
    return idle


def cpu_share(ops: list[OpInstance]) -> dict[str, float]:
    """The ops' worker-thread CPU time over their wall time, where the executor measured it
    (`cpu_share`): below 1, the ops waited for a core or the GIL while they ran (the other
    device's thread, the scheduler, or other work on the machine)."""
    cpu = wall = 0.0
    for o in ops:
        if o.cpu_s is not None and o.start is not None and o.end is not None:
            cpu += o.cpu_s
            wall += o.end - o.start
    return {"cpu_share": cpu / wall} if wall > 0 else {}


async def _accuracy_run(model: Model, est: Estimators, devices: list[Device],
                        calibrate: int) -> dict:
    """`calibrate` runs of another mix refit the estimators online (as a live server does);
    a background re-profile they set off finishes; then the estimators are frozen, the
    workload is predicted, and run (alone: the simulator knows nothing of a sweep beside).
    Two more identical runs of it then measure the machine's own spread (`twin_spread`;
    the second and third, each a row count the process has run before)."""
    sched = build_scheduler(model, devices, SchedulerConfig(policy="fcfs"), est)
    await sched.start()
    est.unfreeze()
    for k in range(calibrate):
        await _workload(sched, f"c{k}-", CALIBRATION)
    if sched.profiler is not None:
        await sched.profiler.idle()
    est.freeze()
    predicted, actual, ratios = await _workload(sched, "a")
    twins = [(await _workload(sched, tag))[1] for tag in ("b", "c")]
    await sched.stop(drain=False)
    return {**prediction_error(predicted, actual), **twin_spread(*twins), **ratios}


def prediction_error(predicted: list[float], actual: list[float]) -> dict[str, float]:
    """End-to-end (the last finish) and per-request errors of a predicted run."""
    e2e_a, e2e_p = max(actual), max(predicted)
    per_req = [abs(p - a) / a for p, a in zip(predicted, actual, strict=True)]
    return {"e2e_actual_s": e2e_a, "e2e_predicted_s": e2e_p,
            "e2e_error": abs(e2e_p - e2e_a) / e2e_a, "request_mape": statistics.mean(per_req)}


def twin_spread(first: list[float], second: list[float]) -> dict[str, float]:
    """How far two identical runs of the workload, back to back, differ: the second's
    end-to-end and per-request times against the first's, as the errors above. No
    prediction made before a run can be held to much less on that machine."""
    spread = prediction_error(second, first)
    return {"twin_e2e_spread": spread["e2e_error"], "twin_request_spread": spread["request_mape"]}


def accuracy(model_spec: str, devices: list[Device], repeats: int, calibrate: int = 8,
             ab: bool = False) -> dict[str, Any]:
    """Predict a mixed batch workload before issuing it, then run it for real; medians over
    `repeats`, each from the start-up fit (profiled, or read back from its cache), and
    every repeat's figures (`runs`: how far identical runs spread). `ab`: each repeat also
    runs with the co-location slowdowns not learnt online (the profile's kept), the two in
    turn, which goes first alternating by repeat (`without_learning`)."""
    model = load(model_spec, dtype="bfloat16")
    runs: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    for k in range(repeats):
        for learn in ((True, False) if k % 2 == 0 else (False, True)) if ab else (True,):
            est = load_or_profile(model, devices)
            est.learn_colocation = learn
            runs[learn].append(asyncio.run(_accuracy_run(model, est, devices, calibrate)))
            gc.collect()
    out = _medians(runs[True])
    return {**out, "without_learning": _medians(runs[False])} if ab else out


def _medians(runs: list[dict[str, float]]) -> dict[str, Any]:
    keys = runs[0].keys()
    return {**{k: statistics.median(r[k] for r in runs) for k in keys}, "runs": runs}


@dataclass(slots=True)
class Recorder:
    """What the slice policy did in a live run: each simulation with the round it was made in
    (counted from 0), and each round's decision time."""

    calls: list[tuple[int, Snapshot, Candidate | None]] = field(default_factory=list)
    round_s: list[float] = field(default_factory=list)

    def simulate(self, snap: Snapshot, cand: Candidate | None) -> Prediction:
        self.calls.append((len(self.round_s), snap, cand))
        return simulate(snap, cand)


class RecordedPolicy:
    """The slice policy, recorded: its simulator is `Recorder.simulate`, and every
    `schedule` is timed. It decides as the policy alone does."""

    name = SlicePolicy.name
    uses_simulation = True

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.policy = SlicePolicy(recorder.simulate)

    def schedule(self, view: RoundView) -> RoundDecision:
        t0 = time.perf_counter()
        decision = self.policy.schedule(view)
        self.recorder.round_s.append(time.perf_counter() - t0)
        return decision


def rounds(model_spec: str, devices: list[Device], seconds: float, repeats: int = 1
           ) -> dict[str, Any]:
    """Record the slice policy's simulations in a live run, replay them in this quiet process
    (`repeats` times: the replay's p50 and p99 are medians over them)."""
    model = load(model_spec, dtype="bfloat16")
    est = load_or_profile(model, devices)
    recorder = Recorder()

    def record(sched: Scheduler) -> None:
        assert isinstance(sched.policy, SlicePolicy)
        sched.policy = RecordedPolicy(recorder)  # NOTE: before the scheduler's first round

    w = Workload(hp_requests=int(seconds * 1.2), rate_scale=0.5)
    run_policy(model, est, "slice", w, ",".join(d.name for d in devices),
               devices[0].memory_bytes / 2**30, 1.0, with_lp=True, on_scheduler=record)
    live = recorder.round_s
    p50s, p99s = [], []
    for _ in range(max(1, repeats)):
        replay = sorted(_replay(recorder).values()) or [0.0]
        p50s.append(_q(replay, 0.5))
        p99s.append(_q(replay, 0.99))
    live_sorted = sorted(live) or [0.0]
    calls = len(recorder.calls)
    return {"round_p50_ms": statistics.median(p50s) * 1e3,
            "round_p99_ms": statistics.median(p99s) * 1e3,
            "round_p99_ms_replays": [x * 1e3 for x in p99s],
            "live_round_p50_ms": _q(live_sorted, 0.5) * 1e3,
            "live_round_p99_ms": _q(live_sorted, 0.99) * 1e3, "rounds": len(replay),
            "live_rounds": len(live), "simulations": calls,
            "simulations_per_round": calls / max(1, len({r for r, _, _ in recorder.calls}))}


def _replay(recorder: Recorder) -> dict[int, float]:
    """Seconds of simulation per round (rounds that simulated), each snapshot's graph built
    again on its first simulation, as the live round did."""
    per_round: dict[int, float] = {}
    seen: set[int] = set()
    for rnd, snap, cand in recorder.calls:
        if id(snap) not in seen:
            seen.add(id(snap))
            snap.cache.clear()
        t0 = time.perf_counter()
        simulate(snap, cand)
        per_round[rnd] = per_round.get(rnd, 0.0) + time.perf_counter() - t0
    return per_round


def _q(xs: list[float], q: float) -> float:
    return xs[min(len(xs) - 1, int(q * len(xs)))]


PARTS = ("speed", "rounds", "accuracy")


def main(argv: list[str] | None = None) -> dict[str, object]:
    p = parser("python -m benchmarks.scheduler simulator", __doc__)
    p.add_argument("--model", default="default")
    p.add_argument("--devices", default="cpu:0,cpu:1")
    p.add_argument("--ops", type=int, default=4000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--live-seconds", type=float, default=60.0)
    p.add_argument("--parts", default=",".join(PARTS),
                   help="comma-separated, of: speed (synthetic snapshots, seconds), rounds "
                        "(a live run replayed, ~6 min), accuracy (~1 min)")
    p.add_argument("--colocation-ab", action="store_true",
                   help="accuracy: also run each repeat without learning co-location "
                        "slowdowns online, in turn with the runs that learn them")
    a = p.parse_args(argv)
    parts = [x.strip() for x in a.parts.split(",") if x.strip()]
    if not parts or set(parts) - set(PARTS):
        p.error(f"--parts: choose among {', '.join(PARTS)}")
    print(machine_line(), flush=True)
    result: dict[str, object] = {}
    devices = parse_devices(a.devices, 2.0)
    if "speed" in parts:
        ops = speed([2, 8, 64], a.ops, a.repeats)
        shared = speed([2, 8, 64], a.ops, a.repeats, shared=True)
        result.update(ops_per_ms=ops, ops_per_ms_shared=shared, simulator_loop=simloop.note(),
                      ops_per_ms_python=speed([2, 8, 64], a.ops, a.repeats, native=False),
                      ops_per_ms_shared_python=speed([2, 8, 64], a.ops, a.repeats,
                                                     shared=True, native=False))
    if "accuracy" in parts:
        acc = accuracy(a.model, devices, a.repeats, ab=a.colocation_ab)
        result.update(e2e_error=acc["e2e_error"], accuracy=acc)
    if "rounds" in parts:
        rnd = rounds(a.model, devices, a.live_seconds, a.repeats)
        result.update(round_p99_ms=rnd["round_p99_ms"], rounds=rnd)
    _report(result, a.ops, a.repeats)
    print(machine_line())
    result.update(machine())
    write_json(a.json, result)
    return result


def _report(result: dict, num_ops: int, repeats: int) -> None:
    if "ops_per_ms" in result:
        ops, shared = result["ops_per_ms"], result["ops_per_ms_shared"]
        py, py_shared = result["ops_per_ms_python"], result["ops_per_ms_shared_python"]
        print(f"simulator loop: {result['simulator_loop']}")
        print_table(["devices", "ops in snapshot", "simulated ops/ms",
                     "with interference (one host)", "Python loop", "Python loop, one host"],
                    "rrrrrr", ([n, num_ops, f"{v:.0f}", f"{shared[n]:.0f}", f"{py[n]:.0f}",
                                f"{py_shared[n]:.0f}"] for n, v in ops.items()))
    if "rounds" in result:
        rnd = result["rounds"]
        print(f"\nround decision (replayed {repeats}x, quiet; medians): p50 "
              f"{rnd['round_p50_ms']:.3f} ms, p99 {rnd['round_p99_ms']:.3f} ms over "
              f"{rnd['rounds']} rounds that simulated (p99 per replay: "
              f"{', '.join(f'{x:.3f}' for x in rnd['round_p99_ms_replays'])} ms; "
              f"{rnd['simulations_per_round']:.1f} simulations a round); live round p50 "
              f"{rnd['live_round_p50_ms']:.3f} ms, p99 {rnd['live_round_p99_ms']:.3f} ms "
              f"over {rnd['live_rounds']} rounds")
    if "accuracy" in result:
        _report_accuracy("accuracy", result["accuracy"])
        if "without_learning" in result["accuracy"]:
            _report_accuracy("without learning co-location online",
                             result["accuracy"]["without_learning"])


def _report_accuracy(title: str, acc: dict[str, Any]) -> None:
    print(f"{title}: end-to-end predicted {acc['e2e_predicted_s']:.3f} s vs actual "
          f"{acc['e2e_actual_s']:.3f} s (error {acc['e2e_error']:.2%}); per-request MAPE "
          f"{acc['request_mape']:.2%}; two identical runs after it differ by "
          f"{acc['twin_e2e_spread']:.2%} end-to-end, {acc['twin_request_spread']:.2%} "
          "per request")
    for k, r in enumerate(acc["runs"]):
        print(f"  repeat {k + 1}: predicted {r['e2e_predicted_s']:.3f} s, actual "
              f"{r['e2e_actual_s']:.3f} s, error {r['e2e_error']:.2%}, per-request MAPE "
              f"{r['request_mape']:.2%}; twins {r['twin_e2e_spread']:.2%} / "
              f"{r['twin_request_spread']:.2%}; measured/predicted {_ratios(r)}"
              + (f"; idle gaps {r['gap_actual_s'] * 1e3:.1f} / {r['gap_predicted_s'] * 1e3:.1f} ms"
                 if "gap_actual_s" in r else ""))
    print(f"  measured over predicted time per op kind (medians): {_ratios(acc)}")
    if "gap_actual_s" in acc:
        print(f"  devices idle between ops (medians, summed over devices): measured "
              f"{acc['gap_actual_s'] * 1e3:.1f} ms, predicted {acc['gap_predicted_s'] * 1e3:.1f} "
              f"ms; ops' CPU over wall time {acc.get('cpu_share', float('nan')):.2f}")


def _ratios(figures: dict[str, Any]) -> str:
    return ", ".join(f"{k.removeprefix('op_ratio_')} {v:.2f}x" for k, v in figures.items()
                     if k.startswith("op_ratio_"))
