"""One executor per device: a dependency-driven queue and a worker running one op at a time.

The worker thread picks among ready ops with `pick_next` (the rule the
simulator imports), runs the op, stamps (start, end) and reports the
completion to the asyncio loop. When another op is already ready it runs it
at once, without a round trip through the event loop. Between ops it also
runs work handed to `call` (a re-profile's timed ops: on the device's own
thread and intra-op threads, as its live ops run).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from executors.dispatch import mark_issued, pick_next, scan_ready
from executors.runner import RecvNotReady
from executors.types import Device, OpInstance, OpRole, OpState
from executors.wide import hold, threads_for
from models.cpu import keep_threads

RunOp = Callable[[OpInstance], Any]
OnDone = Callable[[OpInstance], None]

logger = logging.getLogger(__name__)

RECV_RETRY_S = 0.002  # a Recv that could not allocate waits this long before trying again


class Executor:
    """Runs issued ops of one device on its own thread, one at a time.

    `on_done(op)` is called on `loop` (thread-safe hand-off) once the op is DONE or
    FAILED, with `op.start`/`op.end` stamped from `time.monotonic()`; with `loop=None`
    it is called in the worker thread. Subclasses override `_thread_init` and `_run`.
    """

    recovers = False  # whether a dead executor may come back (a restarted Ray actor)
    # NOTE: whether the worker thread's CPU time is the op's (not for ops it only hands to a
    # GPU or a remote actor and waits on)
    measures_cpu = True

    def __init__(self, device: Device, run_op: RunOp, on_done: OnDone,
                 loop: asyncio.AbstractEventLoop | None, intra_op_threads: int = 1) -> None:
        self.device = device
        self._run_op = run_op
        self._on_done = on_done
        self._loop = loop
        self._threads = intra_op_threads
        self._pending: list[OpInstance] = []
        self._calls: list[tuple[Callable[[], Any], Future[Any]]] = []  # run before ops
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.busy_s = 0.0  # total time spent running ops
        self.alive = True
        self.running: OpInstance | None = None
        # set by the group: wakes every executor (an op here may unblock ops elsewhere)
        self.wake_all: Callable[[], None] = self.notify

    # -- called from the event loop ------------------------------------------------------
    def enqueue(self, op: OpInstance) -> None:
        """Queue `op` (a FAILED op is re-issued for a retry; see `dispatch.mark_issued`).
        On a dead executor the op fails at once."""
        self.enqueue_many([op])

    def enqueue_many(self, ops: list[OpInstance]) -> None:
        """Queue several ops under one lock, waking the worker once."""
        with self._cond:
            if self.alive:
                now = time.monotonic()
                for op in ops:
                    mark_issued(op, now)
                self._pending.extend(ops)
                self._cond.notify()
                return
        for op in ops:
            self._fail(op, RuntimeError(f"executor {self.device.name} is dead"))

    def call(self, fn: Callable[[], Any]) -> Future[Any]:
        """Run `fn` on the worker thread before its next op (thread-safe); its result or
        error goes to the future (on a dead or stopped executor, an error at once)."""
        fut: Future[Any] = Future()
        with self._cond:
            if self.alive and not self._stopping:
                self._calls.append((fn, fut))
                self._cond.notify()
                return fut
        fut.set_exception(RuntimeError(f"executor {self.device.name} is not running"))
        return fut

    def cancel(self, ops: set[OpInstance]) -> list[OpInstance]:
        """Remove queued (not running) ops; returns the ones removed."""
        with self._cond:
            removed = [op for op in self._pending if op in ops]
            self._pending = [op for op in self._pending if op not in ops]
            return removed

    def notify(self) -> None:
        """A dependency may have finished elsewhere: look at the queue again."""
        with self._cond:
            self._cond.notify()

    def queued(self) -> list[OpInstance]:
        with self._cond:
            return list(self._pending)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._work, name=f"exec-{self.device.name}",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._fail_calls(RuntimeError(f"executor {self.device.name} stopped"))

    # -- worker thread -------------------------------------------------------------------
    def _next_ready(self) -> tuple[OpInstance | None, float | None]:
        """The op to run now (by `pick_next`), else how long until a waiting op's ready_at."""
        now = time.monotonic()
        ready, wake = scan_ready(self._pending, now)
        return pick_next(ready), None if wake is None else wake - now

    def _take(self) -> OpInstance | tuple[Callable[[], Any], Future[Any]] | None:
        with self._cond:
            while not self._stopping:
                if self._calls:
                    return self._calls.pop(0)
                op, wake = self._next_ready()
                if op is not None:
                    self._pending.remove(op)
                    op.state = OpState.RUNNING
                    self.running = op
                    return op
                # NOTE: woken by enqueue/notify (a dep finished elsewhere) or a Recv retry time
                self._cond.wait(timeout=wake)
            return None

    def _work(self) -> None:
        try:
            self._thread_init()
            while (item := self._take()) is not None:
                if isinstance(item, OpInstance):
                    self._execute(item)
                else:
                    _run_call(*item)
        except BaseException as e:  # NOTE: the thread dies; its ops must not hang
            logger.critical("executor %s died", self.device.name, exc_info=True)
            self._fail_all(e)

    def _fail_all(self, cause: BaseException) -> None:
        """Report every op left on this dead executor as FAILED (their plans end)."""
        with self._cond:
            self.alive = False
            left = [op for op in [self.running, *self._pending] if op is not None]
            self._pending, self.running = [], None
        for op in left:
            self._fail(op, RuntimeError(f"executor {self.device.name} died: {cause!r}"))
        self._fail_calls(RuntimeError(f"executor {self.device.name} died: {cause!r}"))

    def _fail_calls(self, error: Exception) -> None:
        with self._cond:
            calls, self._calls = self._calls, []
        for _, fut in calls:
            fut.set_exception(error)

    def _fail(self, op: OpInstance, error: Exception) -> None:
        op.error, op.end, op.state = error, time.monotonic(), OpState.FAILED
        self._report(op)

    def _thread_init(self) -> None:
        """Runs first in the worker thread (override point: CUDA device and stream)."""
        keep_threads(self._threads)

    def _prepare(self, op: OpInstance) -> bool:
        """Work before the op's clock starts (override point); True if there was some.

        NOTE: the device's batch tensors are built here: the profile times operators on
        built batches, and the first op of a batch on a device (an embedding of tens of
        microseconds) read as drifted 4-9x with the build in its time."""
        if op.batch is None or op.batch.built is not None:
            return False
        op.batch.get()
        return True

    def _run(self, op: OpInstance) -> Any:
        """Run `op` to completion and return its output (override point: CUDA streams)."""
        return self._run_op(op)

    def _run_any(self, op: OpInstance) -> Any:
        """A HOLD (`executors.wide`) sleeps until its wide chain ends (a claim ends at once).
        Else `_run`, on both devices' threads while the op's partner is held for it."""
        if op.role is OpRole.HOLD:
            with self._cond:
                hold(op, time.monotonic, lambda s: self._cond.wait(timeout=s))
            return None
        threads = threads_for(op, self._threads)
        if threads == self._threads:
            return self._run(op)
        keep_threads(threads)
        try:
            return self._run(op)
        finally:
            keep_threads(self._threads)

    def _execute(self, op: OpInstance) -> None:
        op.start = time.monotonic()
        cpu0 = time.thread_time()
        op.attempts += 1
        try:
            if self._prepare(op):
                op.start, cpu0 = time.monotonic(), time.thread_time()
            op.output = self._run_any(op)
            state = OpState.DONE
        except RecvNotReady:
            self._requeue_recv(op)
            return
        except Exception as e:  # an op fault: reported, the executor keeps running
            op.error, state = e, OpState.FAILED
        op.end = time.monotonic()  # NOTE: end before state, so dependents see both
        op.cpu_s = time.thread_time() - cpu0 if self.measures_cpu else None
        op.state = state
        self.busy_s += op.end - op.start
        self.running = None
        self.wake_all()
        self._report(op)

    def _report(self, op: OpInstance) -> None:
        if self._loop is None:
            self._on_done(op)
            return
        # NOTE: a loop closed under us (shutdown) raises RuntimeError: nobody is listening
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._on_done, op)

    def _requeue_recv(self, op: OpInstance) -> None:
        with self._cond:
            op.state, op.start = OpState.ISSUED, None
            op.ready_at = time.monotonic() + RECV_RETRY_S  # others may run meanwhile
            self._pending.append(op)
            self.running = None


def _run_call(fn: Callable[[], Any], fut: Future[Any]) -> None:
    if not fut.set_running_or_notify_cancel():
        return
    try:
        fut.set_result(fn())
    except Exception as e:  # NOTE: the caller's error, not the executor's: it keeps running
        fut.set_exception(e)


def link(executors: list[Executor]) -> None:
    """Let each executor wake the others when one of its ops finishes."""
    def wake_all() -> None:
        for e in executors:
            e.notify()
    for e in executors:
        e.wake_all = wake_all
