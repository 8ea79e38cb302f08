"""Executor: ready rule, one op at a time, pick_next order, faults and retries (real threads)."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import defaultdict

import pytest
import torch

from executors.executor import Executor
from executors.types import Device, OpInstance, OpState, Priority
from tests.executors.chains import Sink, executors, plain_op, poll


def test_one_op_at_a_time_and_ready_rule_under_concurrent_enqueues() -> None:
    intervals: dict[str, list[tuple[float, float]]] = defaultdict(list)
    lock = threading.Lock()

    def run_op(op: OpInstance) -> None:
        t0 = time.monotonic()
        time.sleep(0.0002)
        with lock:
            intervals[op.device].append((t0, time.monotonic()))

    sink, created = Sink(), list[OpInstance]()
    with executors(["cpu:0", "cpu:1"], run_op, sink) as exs:
        def producer(seed: int) -> None:
            rng = random.Random(seed)
            for _ in range(25):
                with lock:
                    deps = tuple(rng.sample(created, min(len(created), rng.randint(0, 2))))
                op = plain_op(f"cpu:{rng.randint(0, 1)}", Priority(rng.randint(0, 2)), deps)
                exs[op.device].enqueue(op)
                with lock:
                    created.append(op)
        threads = [threading.Thread(target=producer, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        sink.wait_finished(created)
    assert len(sink.done) == len(created) == 100
    for spans in intervals.values():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))
    for op in created:
        assert op.state is OpState.DONE and op.ready_at is not None and op.start is not None
        # the worker's CPU time in it: stamped, and a sleep spends almost none of its wall time
        assert op.end is not None and op.cpu_s is not None
        assert 0 <= op.cpu_s < op.end - op.start
        ends = [d.end for d in op.deps if d.end is not None]
        assert op.ready_at == max([op.issued_at or 0.0, *ends])
        assert op.start >= op.ready_at


def _gate(device: str) -> tuple[OpInstance, threading.Event]:
    return plain_op(device, Priority.LOW, name="gate"), threading.Event()


def test_pick_next_order_priority_then_ready_time() -> None:
    gate, release = _gate("cpu:0")
    order: list[str] = []

    def run_op(op: OpInstance) -> None:
        if op is gate:
            assert release.wait(30)
        order.append(op.name)

    sink = Sink()
    with executors(["cpu:0"], run_op, sink) as exs:
        exs["cpu:0"].enqueue(gate)
        poll(lambda: gate.state is OpState.RUNNING)
        ops = [plain_op("cpu:0", p, name=n) for p, n in [
            (Priority.LOW, "low"), (Priority.HIGH, "high1"), (Priority.NORMAL, "normal"),
            (Priority.HIGH, "high2")]]
        for op in ops:
            exs["cpu:0"].enqueue(op)
        release.set()
        sink.wait_finished(ops)
    assert order == ["gate", "high1", "high2", "normal", "low"]


def test_dependent_waits_for_its_dep_on_another_device() -> None:
    gate, release = _gate("cpu:0")
    after = plain_op("cpu:1", Priority.HIGH, deps=(gate,))
    other = plain_op("cpu:1", Priority.LOW)

    def run_op(op: OpInstance) -> None:
        if op is gate:
            assert release.wait(30)

    sink = Sink()
    with executors(["cpu:0", "cpu:1"], run_op, sink) as exs:
        exs["cpu:0"].enqueue(gate)
        exs["cpu:1"].enqueue(after)
        exs["cpu:1"].enqueue(other)
        sink.wait_finished([other])  # cpu:1 is not blocked by the op waiting on cpu:0
        assert after.state is OpState.ISSUED
        release.set()
        sink.wait_finished([after])
    assert gate.end is not None and after.start is not None and after.start >= gate.end


def test_fault_is_reported_others_keep_running_and_retry_succeeds() -> None:
    failed_once: set[int] = set()
    bad = plain_op("cpu:0", name="bad")
    child = plain_op("cpu:0", deps=(bad,), name="child")
    ran: list[str] = []

    def run_op(op: OpInstance) -> str:
        if op is bad and op.op_id not in failed_once:
            failed_once.add(op.op_id)
            raise RuntimeError("injected fault")
        ran.append(op.name)
        return op.name

    sink = Sink()
    with executors(["cpu:0"], run_op, sink) as exs:
        exs["cpu:0"].enqueue(bad)
        exs["cpu:0"].enqueue(child)
        sink.wait_finished([bad])
        assert bad.state is OpState.FAILED and isinstance(bad.error, RuntimeError)
        later = plain_op("cpu:0", name="later")
        exs["cpu:0"].enqueue(later)
        sink.wait_finished([later])  # the executor keeps running other ops
        assert child.state is OpState.ISSUED  # its input failed: it waits, never runs
        exs["cpu:0"].enqueue(bad)  # retry: only the failed op and its waiting dependents run
        sink.wait_finished([bad, child])
    assert bad.state is OpState.DONE and bad.error is None and bad.output == "bad"
    assert bad.attempts == 2 and child.attempts == 1 and later.attempts == 1
    assert ran == ["later", "bad", "child"]
    assert sink.events == [("bad", OpState.FAILED), ("later", OpState.DONE),
                           ("bad", OpState.DONE), ("child", OpState.DONE)]


@pytest.mark.asyncio(loop_scope="function")
async def test_completions_are_delivered_on_the_event_loop() -> None:
    loop = asyncio.get_running_loop()
    done: asyncio.Queue[tuple[OpInstance, int]] = asyncio.Queue()
    ex = Executor(Device("cpu:0", 1 << 30), lambda op: None,
                  lambda op: done.put_nowait((op, threading.get_ident())), loop)
    ex.start()
    try:
        op = plain_op("cpu:0")
        ex.enqueue(op)
        got, thread_id = await asyncio.wait_for(done.get(), 30)
    finally:
        ex.stop()
    assert got is op and thread_id == threading.get_ident() and op.state is OpState.DONE
    assert op.start is not None and op.end is not None and op.start <= op.end


class _Fatal(BaseException):
    """Escapes the per-op fault handler, as a dying interpreter thread would."""


def test_a_dying_executor_fails_every_op_it_holds_and_refuses_new_ones() -> None:
    started = threading.Event()

    def run_op(op: OpInstance) -> None:
        if op.name == "fatal":
            started.set()
            raise _Fatal()

    sink = Sink()
    ex = Executor(Device("cpu:0", 1 << 20), run_op, sink, None)
    fatal = plain_op("cpu:0", Priority.HIGH, name="fatal")
    queued = [plain_op("cpu:0", Priority.LOW, name=f"q{i}") for i in range(3)]
    ex.enqueue(fatal)
    for op in queued:
        ex.enqueue(op)
    ex.start()
    try:
        sink.wait_finished([fatal, *queued])
        assert not ex.alive
        assert all(op.state is OpState.FAILED and "died" in str(op.error)
                   for op in [fatal, *queued])
        late = plain_op("cpu:0")
        ex.enqueue(late)
        sink.wait_finished([late])
        assert late.state is OpState.FAILED and "dead" in str(late.error)
    finally:
        ex.stop()


def test_an_executor_that_hands_its_ops_away_leaves_their_cpu_time_unmeasured() -> None:
    class HandsAway(Executor):
        measures_cpu = False  # as the CUDA and Ray executors: the thread only waits

    sink = Sink()
    ex = HandsAway(Device("cpu:0", 1 << 40), lambda op: time.sleep(0.0002), sink, None)
    ex.start()
    try:
        op = plain_op("cpu:0")
        ex.enqueue(op)
        sink.wait_finished([op])
    finally:
        ex.stop()
    assert op.state is OpState.DONE and op.cpu_s is None


def test_a_batch_is_built_before_the_op_clock_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    import models.batch

    def slow_build(*args: object) -> object:
        time.sleep(0.05)  # a batch that takes long to lay out
        return object()

    monkeypatch.setattr(models.batch, "build_batch", slow_build)
    sink = Sink()
    seen: list[object] = []
    ex = Executor(Device("cpu:0", 1 << 40), lambda op: seen.append(op.batch.built), sink,
                  None)
    ex.start()
    try:
        op = plain_op("cpu:0")
        op.batch = models.batch.BatchSource([], 16, torch.device("cpu"))
        t0 = time.monotonic()
        ex.enqueue(op)
        sink.wait_finished([op])
    finally:
        ex.stop()
    assert op.state is OpState.DONE and seen and seen[0] is not None  # built before the op ran
    assert op.start is not None and op.end is not None
    assert op.start - t0 >= 0.05 and op.end - op.start < 0.04  # the build is not the op's time


def test_a_call_runs_on_the_worker_thread_before_the_next_op() -> None:
    started, gate = threading.Event(), threading.Event()
    order: list[str] = []

    def run_op(op: OpInstance) -> None:
        if op.name == "gate":
            started.set()
            gate.wait(5)
        order.append(op.name)

    def call() -> str:
        order.append("call")
        return threading.current_thread().name

    sink = Sink()
    ex = Executor(Device("cpu:0", 1 << 20), run_op, sink, None, intra_op_threads=1)
    ex.start()
    try:
        first, later = plain_op("cpu:0", name="gate"), plain_op("cpu:0", name="later")
        ex.enqueue_many([first, later])
        assert started.wait(5)
        fut = ex.call(call)
        failing = ex.call(lambda: 1 / 0)
        gate.set()
        assert fut.result(5) == "exec-cpu:0"  # the device's own thread
        with pytest.raises(ZeroDivisionError):
            failing.result(5)
        sink.wait_finished([first, later])
        assert order == ["gate", "call", "later"]  # between ops, ahead of queued ones
        assert ex.alive and later.state is OpState.DONE  # the call's error was the caller's
    finally:
        ex.stop()
    with pytest.raises(RuntimeError, match="not running"):
        ex.call(lambda: None).result(1)
