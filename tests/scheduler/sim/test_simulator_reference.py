"""The simulator's fast paths predict exactly what a straightforward reference does.

`tests.scheduler.simref.reference` keeps ops as records, scans ready lists with
`pick_next` and re-times every running op of a shared host after every event; the
simulator keeps flat lists, dispatch-key heaps and slowdowns cached per set of running
classes, in Python or in C (`scheduler.sim.native`). Random snapshots (running ops, ops
waiting on finished ones, several hosts, ties in time, candidates extending a cached
graph) must give equal predictions, through either loop.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.scheduler.simulator import synthetic_gmg
from executors.interference import OP_CLASSES, Interference
from executors.types import Priority
from scheduler.sim.gmg import DeviceView, SimOp, Snapshot
from scheduler.sim.simulator import simulate
from scheduler.sim.types import Candidate
from tests.scheduler.simref import reference

NAMES = ("embed", "layers[0:5]", "layers[5:10]", "head", "send", "recv")


def _interference(rng: random.Random, devices: list[str]) -> Interference | None:
    kind = rng.random()
    if kind < 0.15:
        return None
    hosts = {d: rng.choice("ab") for d in devices if rng.random() < 0.9}
    if kind < 0.25:
        return Interference(hosts, {})  # neutral: the solo path
    slow = {(a, b): rng.choice((1.0, 1.1, 1.25, 1.5, 2.0)) for a in OP_CLASSES
            for b in OP_CLASSES if rng.random() < 0.7}
    return Interference(hosts, slow)


def _duration(rng: random.Random) -> float:
    # NOTE: multiples of 1/64 make ties in time (the seq order decides), others do not
    return rng.randint(1, 16) / 64 if rng.random() < 0.5 else rng.uniform(0.001, 0.3)


def _ops(rng: random.Random, devices: list[str], first_id: int, num_chains: int,
         now: float, deps_on: list[int], running: set[str] | None) -> list[SimOp]:
    """Chains over random devices; with `running`, a chain's first op may run already (one
    per device) and a chain may wait on a finished op (an id outside the graph)."""
    ops: list[SimOp] = []
    for c in range(num_chains):
        prio = rng.choice(list(Priority))
        issued = now if running is None else rng.choice((0.0, now / 2, now))
        prev: tuple[int, ...] = ()
        if deps_on and rng.random() < 0.5:
            prev = (rng.choice(deps_on),)
        elif running is not None and rng.random() < 0.2:
            prev = (10**6 + c,)  # finished: not in the graph
        for _ in range(rng.randint(1, 6)):
            dev = rng.choice(devices)
            start = None
            if running is not None and not prev and dev not in running and rng.random() < 0.5:
                running.add(dev)
                start = rng.uniform(max(0.0, now - 0.3), now)
            first = (f"r{first_id + len(ops)}",) if rng.random() < 0.2 else ()
            op = SimOp(first_id + len(ops), rng.choice(NAMES), dev, prio, prev,
                       _duration(rng), issued, start, rng.randint(0, 4) << 20, first, issued)
            ops.append(op)
            prev = (op.op_id,) if rng.random() < 0.9 else ()
    return ops


def _case(seed: int) -> tuple[Snapshot, list[Candidate]]:
    rng = random.Random(seed)
    devices = [f"cpu:{i}" for i in range(rng.randint(1, 5))]
    views = tuple(DeviceView(d, rng.randint(20, 60) << 20, rng.randint(0, 20) << 20)
                  for d in devices if rng.random() < 0.8)
    now = rng.choice((0.0, 1.0, 2.5))
    ops = _ops(rng, devices, 0, rng.randint(0, 8), now, [], set())
    deadlines = tuple((f"r{i}", now + 0.5) for i in range(3))
    snap = Snapshot(now, tuple(ops), views, deadlines, _interference(rng, devices))
    ids = [o.op_id for o in ops]
    cands = []
    for k in range(rng.randint(1, 3)):
        new = _ops(rng, devices + ["cpu:9"] * (rng.random() < 0.1), 1000 * (k + 1),
                   rng.randint(1, 2), now, ids, None)
        cands.append(Candidate(tuple(new), {d: rng.randint(0, 8) << 20 for d in devices[:1]}))
    return snap, cands


LOOPS = pytest.mark.parametrize("native", [True, False], ids=["C loop", "Python loop"])


@LOOPS
@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_simulate_equals_the_reference_on_random_snapshots(native: bool, seed: int) -> None:
    snap, cands = _case(seed)
    assert simulate(snap, native=native) == reference(snap)
    for cand in cands:  # NOTE: each extends the snapshot's graph, cached by the first call
        assert simulate(snap, cand, native=native) == reference(snap, cand)
    assert simulate(snap, native=native) == reference(snap)


@LOOPS
def test_simulate_equals_the_reference_on_the_bench_snapshots(native: bool) -> None:
    for n, shared in ((2, True), (3, True), (2, False)):
        snap = synthetic_gmg(n, 600, seed=n, shared=shared).snapshot(0.0)
        assert simulate(snap, native=native) == reference(snap)


@LOOPS
def test_the_end_is_the_last_completion_on_a_shared_host(native: bool) -> None:
    # cpu:0's op speeds up once cpu:1's ends: its first (stale) timing is later than its end
    inter = Interference({"cpu:0": "h", "cpu:1": "h"}, {("layers", "layers"): 1.5})
    a = SimOp(0, "layers[0:5]", "cpu:0", Priority.LOW, (), 1.0, 0.0, None, 0)
    b = SimOp(1, "layers[0:5]", "cpu:1", Priority.LOW, (), 0.5, 0.0, None, 0)
    pred = simulate(Snapshot(0.0, (a, b), (), (), inter), native=native)
    assert pred.finish[1] == 0.75
    assert pred.end == pred.finish[0] == 0.75 + 0.5


@LOOPS
def test_ops_timed_together_on_a_host_end_in_device_order_on_a_tie(native: bool) -> None:
    # a RECV running on cpu:1 and one starting on cpu:0 (no slowdown) end together; cpu:0's
    # is timed first, so its successor takes the idle cpu:2 first
    inter = Interference({"cpu:0": "h", "cpu:1": "h"}, {("layers", "layers"): 1.5})
    a = SimOp(0, "recv", "cpu:1", Priority.LOW, (), 0.5, 0.0, 0.0, 0)
    b = SimOp(1, "recv", "cpu:0", Priority.LOW, (), 0.5, 0.0, None, 0)
    c = SimOp(2, "embed", "cpu:2", Priority.LOW, (0,), 0.25, 0.0, None, 0)
    d = SimOp(3, "embed", "cpu:2", Priority.LOW, (1,), 0.25, 0.0, None, 0)
    snap = Snapshot(0.0, (a, b, c, d), (), (), inter)
    pred = simulate(snap, native=native)
    assert pred == reference(snap)
    assert pred.start[3] == 0.5 and pred.start[2] == 0.75
