"""The simulator predicts a FakeExecutor run on the virtual clock exactly (same dispatch rule)."""

from __future__ import annotations

import pytest

from executors.fake import VirtualCluster
from executors.types import OpInstance, Priority
from scheduler.gmg import SimOp, Snapshot
from scheduler.simulator import Candidate, simulate
from tests.scheduler.helpers import devices, empty_gmg, random_graph


def _run_fake(ops: list[OpInstance], n: int) -> dict[int, tuple[float, float]]:
    cluster = VirtualCluster()
    for dev in devices(n).values():
        cluster.add(dev, lambda op: None)
    for op in ops:
        cluster.executors[op.device].enqueue(op)
    cluster.run_until_idle()
    return {op.op_id: (op.start, op.end) for op in ops}  # type: ignore[misc]


def _predict(ops: list[OpInstance], n: int) -> dict[int, tuple[float, float]]:
    gmg = empty_gmg(devices(n))
    gmg.add(ops, {})
    for op in ops:
        op.issued_at = 0.0
        gmg.mark_issued(op)
    pred = simulate(gmg.snapshot(0.0))
    return {i: (pred.start[i], pred.finish[i]) for i in pred.start}


@pytest.mark.parametrize("seed", range(8))
def test_simulator_agrees_exactly_with_fake_executors(seed: int) -> None:
    want = _run_fake(random_graph(seed), 3)
    got = _predict(random_graph(seed), 3)
    assert got == want


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
