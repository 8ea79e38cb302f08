"""The simulator predicts a FakeExecutor run on the virtual clock exactly (same dispatch rule)."""

from __future__ import annotations

import pytest

from executors.fake import VirtualCluster
from executors.interference import Interference
from executors.types import OpInstance, OpRole, Priority
from scheduler.sim.gmg import SimOp, Snapshot
from scheduler.sim.simulator import simulate
from scheduler.sim.types import Candidate
from tests.scheduler.helpers import devices, empty_gmg, random_graph

# an injected co-location model: cpu:0 and cpu:1 share a host, cpu:2 is alone
SHARED = Interference({"cpu:0": "h", "cpu:1": "h", "cpu:2": "other"},
                      {("compute", "compute"): 1.0, ("layers", "layers"): 1.3,
                       ("layers", "send"): 1.1, ("send", "layers"): 1.7,
                       ("head", "layers"): 1.25, ("layers", "head"): 1.05})


def _run_fake(ops: list[OpInstance], n: int, inter: Interference | None = None
              ) -> dict[int, tuple[float, float]]:
    cluster = VirtualCluster(interference=inter)
    for dev in devices(n).values():
        cluster.add(dev, lambda op: None)
    for op in ops:
        cluster.executors[op.device].enqueue(op)
    cluster.run_until_idle()
    return {op.op_id: (op.start, op.end) for op in ops}  # type: ignore[misc]


def _predict(ops: list[OpInstance], n: int, inter: Interference | None = None,
             native: bool = True) -> dict[int, tuple[float, float]]:
    gmg = empty_gmg(devices(n))
    gmg.interference = inter
    gmg.add(ops, {})
    for op in ops:
        op.issued_at = 0.0
        gmg.mark_issued(op)
    pred = simulate(gmg.snapshot(0.0), native=native)
    return {i: (pred.start[i], pred.finish[i]) for i in pred.start}


@pytest.mark.parametrize("native", [True, False], ids=["C loop", "Python loop"])
@pytest.mark.parametrize("seed", range(8))
def test_simulator_agrees_exactly_with_fake_executors(seed: int, native: bool) -> None:
    want = _run_fake(random_graph(seed), 3)
    got = _predict(random_graph(seed), 3, native=native)
    assert got == want


def _classed(ops: list[OpInstance], seed: int) -> list[OpInstance]:
    """Name compute ops after real op classes, so that they interfere."""
    names = ["embed", "layers[0:5]", "layers[5:10]", "head"]
    for op in ops:
        if op.role is OpRole.COMPUTE:
            op.name = names[(op.op_id * 7 + seed) % len(names)]
    return ops


@pytest.mark.parametrize("native", [True, False], ids=["C loop", "Python loop"])
@pytest.mark.parametrize("seed", range(8))
def test_simulator_agrees_exactly_with_fake_executors_under_interference(seed: int,
                                                                          native: bool) -> None:
    want = _run_fake(_classed(random_graph(seed), seed), 3, SHARED)
    got = _predict(_classed(random_graph(seed), seed), 3, SHARED, native)
    assert got == want
    solo = _predict(_classed(random_graph(seed), seed), 3)
    assert sum(f - s for s, f in got.values()) > sum(f - s for s, f in solo.values())


def test_overlap_on_a_shared_host_is_slowed_fluidly() -> None:
    # two layer groups of 1 s start together on cpu:0 and cpu:1 (slowdown 1.3 each while
    # both run); a 0.5 s one follows on cpu:1, so cpu:0's op runs alone at the end
    a = SimOp(0, "layers[0:5]", "cpu:0", Priority.LOW, (), 1.0, 0.0, None, 0)
    b = SimOp(1, "layers[0:5]", "cpu:1", Priority.LOW, (), 0.26, 0.0, None, 0)
    c = SimOp(2, "embed", "cpu:2", Priority.LOW, (), 1.0, 0.0, None, 0)
    snap = Snapshot(0.0, (a, b, c), (), (), SHARED)
    pred = simulate(snap)
    assert pred.finish[1] == pytest.approx(0.26 * 1.3)  # slowed all along
    # a did 0.26 s of solo work by then, then 0.74 s alone
    assert pred.finish[0] == pytest.approx(0.26 * 1.3 + 0.74)
    assert pred.finish[2] == 1.0  # alone on its host


def test_high_priority_waits_at_most_one_op() -> None:
    # op 0 runs since t=0; ops 1..5 queue behind it; a high op arrives at t=0.2
    running = SimOp(0, "layers", "cpu:0", Priority.LOW, (), 0.5, 0.0, 0.0, 0)
    queued = [SimOp(i, "layers", "cpu:0", Priority.LOW, (i - 1,), 0.5, 0.0, None, 0)
              for i in range(1, 6)]
    high = SimOp(99, "layers", "cpu:0", Priority.HIGH, (), 0.25, 0.0, None, 0, ("hp",))
    snap = Snapshot(0.2, (running, *queued), (), ())
    pred = simulate(snap, Candidate((high,)))
    assert pred.start[99] == 0.5  # right after the running low op, before the queued ones
    assert pred.first_token["hp"] == 0.75


def test_oom_is_flagged() -> None:
    gmg = empty_gmg(devices(1, mem=10 << 20))
    snap = gmg.snapshot(0.0)
    op = SimOp(1, "x", "cpu:0", Priority.LOW, (), 0.1, 0.0, None, 11 << 20)
    assert simulate(snap, Candidate((op,))).oom
    small = SimOp(1, "x", "cpu:0", Priority.LOW, (), 0.1, 0.0, None, 9 << 20)
    assert not simulate(snap, Candidate((small,))).oom


def test_snapshot_is_unaffected_by_later_mutation() -> None:
    ops = random_graph(1)
    gmg = empty_gmg(devices(3))
    gmg.add(ops, {})
    for op in ops:
        op.issued_at = 0.0
        gmg.mark_issued(op)
    snap = gmg.snapshot(0.0)
    before = simulate(snap)
    ops[0].est_s *= 10
    gmg.finish(ops[1])
    assert simulate(snap) == before
    assert len(snap.ops) == len(ops)
