"""`python -m benchmarks.scheduler scaling`: one central scheduler's round decision time as
the device count grows, from the simulator alone.

A round that places one prefill scores, as the slice policy does, one
single-device candidate per device plus a split over the two least-loaded
devices, each by a what-if simulation of the whole snapshot. The snapshot holds
`--plans-per-device` plans of 8 operators in flight on every device (the
simulator bench's synthetic graph); the decision time is the sum of those
simulations, including building the round's graph once. It grows with devices x
ops in flight: where it passes one operator's time, a round no longer hides
behind the operator it waits for, and the GMG must be split into sub-graphs.
"""

from __future__ import annotations

import statistics
import time

from benchmarks.harness import machine, machine_line, parser, print_table, write_json
from benchmarks.scheduler.simulator import CHAIN, synthetic_gmg
from executors.types import Priority
from scheduler.sim.gmg import SimOp, Snapshot
from scheduler.sim.simulator import simulate
from scheduler.sim.types import Candidate

OP_S = 5e-3  # a candidate's operators: 5 ms each (the synthetic graph's are 1-20 ms)


def _chain(first_id: int, devices: list[str]) -> Candidate:
    """A prefill's 8 operators, the first half on devices[0] and the rest on devices[-1]."""
    ops, prev = [], None
    for i, name in enumerate(CHAIN):
        dev = devices[0] if i < len(CHAIN) // 2 else devices[-1]
        op = SimOp(first_id + i, name, dev, Priority.HIGH, (prev,) if prev is not None else (),
                   OP_S, 0.0, None, 0, ("new",) if i == len(CHAIN) - 1 else (), 0.0)
        ops.append(op)
        prev = op.op_id
    return Candidate(tuple(ops))


def decision_s(snap: Snapshot, devices: list[str]) -> float:
    """Seconds to score every candidate of one prefill on a fresh snapshot."""
    snap.cache.clear()  # NOTE: a round builds its snapshot's graph once, as here
    first = 1 + max(o.op_id for o in snap.ops)
    loads: dict[str, float] = {}
    for o in snap.ops:
        loads[o.device] = loads.get(o.device, 0.0) + o.est_s
    pair = sorted(devices, key=lambda d: (loads.get(d, 0.0), d))[:2]
    t0 = time.perf_counter()
    for d in devices:
        simulate(snap, _chain(first, [d]))
    simulate(snap, _chain(first, pair))
    return time.perf_counter() - t0


def scaling(counts: list[int], plans_per_device: int, repeats: int) -> list[dict[str, float]]:
    rows = []
    for n in counts:
        gmg = synthetic_gmg(n, plans_per_device * len(CHAIN) * n)
        snap = gmg.snapshot(0.0)
        devices = [f"cpu:{i}" for i in range(n)]
        times = [decision_s(snap, devices) for _ in range(repeats)]
        op_s = statistics.median(o.est_s for o in snap.ops)
        rows.append({"devices": n, "ops_in_flight": len(snap.ops), "candidates": n + 1,
                     "decision_s": statistics.median(times), "median_op_s": op_s})
    return rows


def main(argv: list[str] | None = None) -> dict[str, object]:
    p = parser("python -m benchmarks.scheduler scaling", __doc__)
    p.add_argument("--devices", default="8,64,256")
    p.add_argument("--plans-per-device", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args(argv)
    counts = [int(x) for x in a.devices.split(",")]
    if a.plans_per_device < 1 or a.repeats < 1 or min(counts) < 2:
        p.error("--plans-per-device and --repeats must be >= 1, device counts >= 2")
    print(machine_line(), flush=True)
    rows = scaling(counts, a.plans_per_device, a.repeats)
    print_table(["devices", "ops in flight", "candidates", "round decision ms", "median op ms",
                 "decision / op"], "rrrrrr",
                ([r["devices"], r["ops_in_flight"], r["candidates"],
                  f"{r['decision_s'] * 1e3:.1f}", f"{r['median_op_s'] * 1e3:.1f}",
                  f"{r['decision_s'] / r['median_op_s']:.2f}x"] for r in rows))
    print(machine_line())
    result: dict[str, object] = {"rows": rows, **machine()}
    write_json(a.json, result)
    return result
