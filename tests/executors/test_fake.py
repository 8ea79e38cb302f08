"""FakeExecutor / VirtualCluster: the executor's queue semantics on a deterministic clock."""

from __future__ import annotations

import asyncio
import random

import pytest

from executors.dispatch import dispatch_key
from executors.fake import FakeExecutor, VirtualCluster
from executors.runner import RecvNotReady
from executors.types import Device, OpInstance, OpRole, OpState, Priority
from tests.executors.chains import Sink, plain_op

D0, D1 = Device("cpu:0", 1 << 30), Device("cpu:1", 1 << 30)


def _cluster(sink: Sink, run_op: object = None, **kw: float) -> VirtualCluster:
    vc = VirtualCluster(**kw)
    for d in (D0, D1):
        vc.add(d, sink, run_op)  # type: ignore[arg-type]
    return vc


def _enqueue(vc: VirtualCluster, *ops: OpInstance) -> None:
    for op in ops:
        vc.executors[op.device].enqueue(op)


def _transfer_graph() -> dict[str, OpInstance]:
    a = plain_op("cpu:0", Priority.NORMAL, name="a", est_s=1.0)
    recv = plain_op("cpu:1", Priority.NORMAL, name="recv", est_s=0.125)
    recv.role = OpRole.RECV
    send = plain_op("cpu:0", Priority.NORMAL, (a, recv), name="send", est_s=0.5)
    send.role, send.peer = OpRole.SEND, recv
    b = plain_op("cpu:1", Priority.NORMAL, (send,), name="b", est_s=2.0)
    c = plain_op("cpu:0", Priority.LOW, name="c", est_s=0.25)
    return {op.name: op for op in (a, recv, send, b, c)}


def test_hand_computed_schedule_with_a_transfer() -> None:
    sink = Sink()
    vc = _cluster(sink)
    g = _transfer_graph()
    _enqueue(vc, *g.values())
    assert vc.run_until_idle() == 3.5
    times = {n: (op.start, op.end) for n, op in g.items()}
    assert times == {"a": (0.0, 1.0), "recv": (0.0, 0.125), "send": (1.0, 1.5),
                     "c": (1.5, 1.75), "b": (1.5, 3.5)}
    assert g["send"].ready_at == 1.0 and g["c"].ready_at == 0.0  # priority beat ready time
    assert [n for n, _ in sink.events] == ["recv", "a", "send", "c", "b"]
    assert vc.executors["cpu:0"].busy_s == 1.75


def test_run_until_stops_midway() -> None:
    sink = Sink()
    vc = _cluster(sink)
    g = _transfer_graph()
    _enqueue(vc, *g.values())
    vc.run_until(1.25)
    assert vc.now == 1.25 and [n for n, _ in sink.events] == ["recv", "a"]
    assert g["send"].state is OpState.RUNNING and g["b"].state is OpState.ISSUED
    assert vc.run_until_idle() == 3.5


def test_ties_break_by_priority_then_start_order() -> None:
    sink = Sink()
    vc = _cluster(sink)
    x = plain_op("cpu:0", Priority.LOW, name="x", est_s=1.0)
    y = plain_op("cpu:1", Priority.HIGH, name="y", est_s=1.0)
    _enqueue(vc, x, y)
    vc.run_until_idle()
    z0 = plain_op("cpu:0", Priority.NORMAL, name="z0", est_s=1.0)
    z1 = plain_op("cpu:1", Priority.NORMAL, name="z1", est_s=1.0)
    _enqueue(vc, z1, z0)
    vc.run_until_idle()
    assert [n for n, _ in sink.events] == ["y", "x", "z0", "z1"]  # cpu:0 was added first


def _random_graph(seed: int) -> list[OpInstance]:
    rng = random.Random(seed)
    ops: list[OpInstance] = []
    for _ in range(60):
        deps = tuple(rng.sample(ops, min(len(ops), rng.randint(0, 2))))
        ops.append(plain_op(rng.choice(["cpu:0", "cpu:1"]), Priority(rng.randint(0, 2)), deps,
                            est_s=rng.choice([0.0, 0.5, 1.0, 1.5])))
    return ops


def _trace(seed: int) -> tuple[list[OpInstance], list[tuple[float, float, float]]]:
    sink = Sink()
    vc = _cluster(sink)
    ops = _random_graph(seed)
    _enqueue(vc, *ops)
    vc.run_until_idle()
    order = {op.op_id: i for i, op in enumerate(ops)}
    return ops, [(order[op.op_id], op.start or 0.0, op.end or 0.0) for op in sink.done]


def test_virtual_clock_is_deterministic_and_obeys_the_dispatch_rule() -> None:
    ops, first = _trace(7)
    assert _trace(7)[1] == first and len(first) == len(ops)
    for op in ops:
        assert op.state is OpState.DONE and op.start is not None and op.ready_at is not None
        assert op.start >= op.ready_at == max([0.0, *(d.end or 0.0 for d in op.deps)])
        assert op.end == op.start + op.est_s
        for other in ops:  # nothing that was ready earlier and ranks higher was passed over
            if other is not op and other.device == op.device and other.start is not None:
                assert not (other.start > op.start and other.ready_at is not None
                            and other.ready_at < op.start
                            and dispatch_key(other) < dispatch_key(op))
    for dev in ("cpu:0", "cpu:1"):
        spans = sorted((op.start or 0.0, op.end or 0.0) for op in ops if op.device == dev)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))


def test_recv_retries_on_the_virtual_clock_while_others_run() -> None:
    allowed = False
    recv = plain_op("cpu:1", Priority.HIGH, name="recv", est_s=0.125)
    recv.role = OpRole.RECV
    other = plain_op("cpu:1", Priority.LOW, name="other", est_s=1.0)

    def run_op(op: OpInstance) -> None:
        if op is recv and not allowed:
            raise RecvNotReady("full")

    def on_done(op: OpInstance) -> None:
        nonlocal allowed
        allowed = True  # "memory released" once `other` finished
    vc = VirtualCluster(recv_retry_s=0.5)
    vc.add(D1, on_done, run_op)
    _enqueue(vc, recv, other)
    vc.run_until_idle()
    # tries at 0 and 1.0 (dispatch runs before on_done), succeeds at 1.5
    assert (other.start, other.end, recv.start, recv.end) == (0.0, 1.0, 1.5, 1.625)
    assert recv.attempts == 3 and recv.state is OpState.DONE


def test_fault_and_retry_on_the_virtual_clock() -> None:
    sink = Sink()
    fired: list[OpInstance] = []
    bad = plain_op("cpu:0", name="bad", est_s=1.0)
    child = plain_op("cpu:0", deps=(bad,), name="child", est_s=1.0)

    def run_op(op: OpInstance) -> str:
        if op is bad and not fired:
            fired.append(op)
            raise RuntimeError("boom")
        return op.name
    vc = _cluster(sink, run_op)
    _enqueue(vc, bad, child)
    assert vc.run_until_idle() == 1.0
    assert bad.state is OpState.FAILED and str(bad.error) == "boom"
    assert child.state is OpState.ISSUED
    _enqueue(vc, bad)
    assert vc.run_until_idle() == 3.0
    assert (bad.start, bad.output, child.start, child.output) == (1.0, "bad", 2.0, "child")
    assert sink.events == [("bad", OpState.FAILED), ("bad", OpState.DONE),
                           ("child", OpState.DONE)]


def test_cancel_removes_queued_ops() -> None:
    sink = Sink()
    vc = _cluster(sink)
    a, b = plain_op("cpu:0", est_s=1.0), plain_op("cpu:0", est_s=1.0)
    _enqueue(vc, a, b)
    ex: FakeExecutor = vc.executors["cpu:0"]
    assert ex.cancel({b}) == [b] and ex.queued() == [a]
    assert vc.run_until_idle() == 1.0 and b.start is None


@pytest.mark.asyncio(loop_scope="function")
async def test_async_driver_advances_time_only_when_the_loop_is_idle() -> None:
    done: asyncio.Queue[OpInstance] = asyncio.Queue()
    vc = VirtualCluster()
    ex = vc.add(D0, done.put_nowait)

    async def scheduler() -> list[OpInstance]:
        issued = []
        for k in range(5):  # issue the next op only after the previous one completed
            op = plain_op("cpu:0", est_s=0.25 * (k + 1))
            for _ in range(3):
                await asyncio.sleep(0)  # a scheduler round that takes several loop turns
            ex.enqueue(op)
            issued.append(op)
            assert await done.get() is op
        return issued

    driver = asyncio.create_task(vc.drive(forever=True))
    try:
        ops = await asyncio.wait_for(scheduler(), 30)
    finally:
        driver.cancel()
    starts = [op.start for op in ops]
    assert starts == [0.0, 0.25, 0.75, 1.5, 2.5] and vc.now == 3.75
