"""Fake executors on one virtual clock: the executor's queue semantics, no tensors.

A `VirtualCluster` owns the clock and a `FakeExecutor` per device. An op takes
exactly `op.est_s` of virtual time, transfer halves (RECV, SEND) included,
unless the cluster has an `Interference` model (below). The rules, which
`scheduler.sim.simulator` must reproduce on a fixed graph:

- **Issue.** `enqueue(op)` at virtual time `now`: state ISSUED, `issued_at = now`
  unless already set (`dispatch.mark_issued`; a finished op is reset for a retry).
- **Ready.** An op is ready when every dep is DONE; `ready_at = max(issued_at,
  deps' end)` (`dispatch.ready_time`), stored the first time it is seen ready.
- **Dispatch.** An idle executor picks `pick_next` among its ops ready at `now`
  and runs it over `[now, now + est_s]`; one op at a time per executor.
  Executors are dispatched in the order they were added to the cluster.
- **Events.** Completions sit in a heap keyed `(end, priority, seq)`; `seq` grows
  with every push (an op's start; a Recv retry's wake-up, priority -1), so ties
  break deterministically. `step()` first dispatches every idle
  executor at `now` (ops enqueued since the last step compete here), then pops
  **one** event, advances `now` to its time, marks the op DONE (or FAILED) with
  `end = now`, dispatches idle executors again at `now`, and only then calls
  `on_done(op)` — as the real worker picks its next op before the loop hears of
  the last one. Ops that `on_done` enqueues start at the next step's dispatch.
- **Interference.** With `VirtualCluster(interference=...)`, ops on executors that
  share a host advance at `1 / slowdown` of their solo speed (`est_s` is the solo
  time), the slowdown given by the classes running on the host
  (`executors.interference`). Whenever a dispatch or a completion changed what
  runs on a host, the host's running ops are re-timed, after the dispatch, in
  executor order: if the classes running there changed, every op whose slowdown
  changed gets a new completion event (settled to `now`); otherwise only the ops
  started since. A replaced event is skipped when popped.
- **Holds.** A wide plan's claim and hold (`executors.wide`) take their `est_s` as any
  op, and `run_op` is not called for them; a real executor ends a hold when its chain
  ends, which is when its estimate says it would.
- **Faults and Recv retries.** The optional `run_op(op)` hook runs when the op
  starts. `RecvNotReady` puts the op back with `ready_at = now + recv_retry_s`
  and the executor picks again at once; any other exception fails the op, which
  still takes `est_s` and reports `op.error`.

Nothing runs on threads: the sync core is `step` / `run_until` /
`run_until_idle`; `drive()` runs it from asyncio, advancing time only while
every other task of the loop is blocked.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from executors.dispatch import mark_issued, pick_next, scan_ready
from executors.interference import Interference, finish_at, settle
from executors.runner import RecvNotReady
from executors.types import Device, OpInstance, OpRole, OpState

RunOp = Callable[[OpInstance], Any]
OnDone = Callable[[OpInstance], None]

RECV_RETRY_S = 0.002  # as executors.executor.RECV_RETRY_S
SETTLE_ROUNDS = 1000  # max event-loop turns `drive` waits for the loop to go idle


@dataclass(order=True, slots=True)
class _Event:
    time: float
    priority: int
    seq: int
    executor: FakeExecutor = field(compare=False)
    op: OpInstance | None = field(compare=False)  # None: a wake-up (a Recv retry is due)
    output: Any = field(compare=False, default=None)
    error: BaseException | None = field(compare=False, default=None)


class FakeExecutor:
    """An executor of one device on a virtual clock (same public surface as `Executor`)."""

    def __init__(self, device: Device, on_done: OnDone, cluster: VirtualCluster,
                 run_op: RunOp | None = None) -> None:
        self.device = device
        self._on_done = on_done
        self._cluster = cluster
        self._run_op = run_op
        self._pending: list[OpInstance] = []
        self._wake_at: float | None = None
        self.running: OpInstance | None = None
        self.busy_s = 0.0  # virtual seconds spent running ops
        self.alive = True
        self.wake_all: Callable[[], None] = self.notify
        self.host = -1  # index of the host it shares with other executors; -1: alone
        self._result: tuple[Any, BaseException | None] = (None, None)  # of the running op
        self._event: _Event | None = None  # the running op's live completion event
        self._cls = -1  # the running op's interference class
        self._rem_s, self._last, self._slow = 0.0, 0.0, 0.0  # its solo seconds left at _last

    def enqueue(self, op: OpInstance) -> None:
        mark_issued(op, self._cluster.now)
        self._pending.append(op)
        self._cluster.poke()

    def enqueue_many(self, ops: list[OpInstance]) -> None:
        for op in ops:
            self.enqueue(op)

    def cancel(self, ops: set[OpInstance]) -> list[OpInstance]:
        """Remove queued (not running) ops; returns the ones removed."""
        removed = [op for op in self._pending if op in ops]
        self._pending = [op for op in self._pending if op not in ops]
        return removed

    def notify(self) -> None:
        """A dep finished outside the cluster: the next step looks at the queue again."""
        self._cluster.poke()

    def queued(self) -> list[OpInstance]:
        return list(self._pending)

    def start(self) -> None:
        """Nothing to start: the cluster drives every fake executor."""

    def stop(self) -> None:
        """Nothing to stop; queued ops stay queued."""

    # -- driven by the cluster -----------------------------------------------------------
    def _dispatch(self, now: float) -> None:
        """If idle, start the next ready op at `now` (Recvs that cannot allocate go back)."""
        while self.running is None:
            op = self._pick(now)
            if op is None:
                return
            self._pending.remove(op)
            op.state, op.start = OpState.RUNNING, now
            op.attempts += 1
            try:
                # NOTE: a HOLD (executors/wide.py) runs nothing: here it takes its est_s
                run = self._run_op if op.role is not OpRole.HOLD else None
                out, err = (run(op) if run else None), None
            except RecvNotReady:  # back in the queue; others may run meanwhile
                op.state, op.start = OpState.ISSUED, None
                op.ready_at = now + self._cluster.recv_retry_s
                self._pending.append(op)
                continue
            except Exception as e:  # an op fault: it still takes est_s, then reports
                out, err = None, e
            self.running = op
            self._result = (out, err)
            self._cluster.started(self, op, now)

    def _pick(self, now: float) -> OpInstance | None:
        ready, wake = scan_ready(self._pending, now)
        if wake is not None and self._wake_at != wake:
            self._wake_at = wake
            self._cluster.push(wake, self, None)
        return pick_next(ready)

    def _complete(self, ev: _Event) -> None:
        op = ev.op
        assert op is not None and op is self.running
        op.end = ev.time
        op.output, op.error = ev.output, ev.error
        op.state = OpState.FAILED if ev.error is not None else OpState.DONE
        assert op.start is not None
        self.busy_s += op.end - op.start
        self.running = None


class VirtualCluster:
    """One virtual clock and the fake executors it advances (see the module docstring)."""

    def __init__(self, start_s: float = 0.0, recv_retry_s: float = RECV_RETRY_S,
                 interference: Interference | None = None) -> None:
        self._now = start_s
        self.recv_retry_s = recv_retry_s
        self.executors: dict[str, FakeExecutor] = {}
        self._heap: list[_Event] = []
        self._seq = 0
        self._poked: asyncio.Event | None = None
        self.interference = interference
        self._hosts: list[_Host] = []  # hosts that two or more executors share

    @property
    def now(self) -> float:
        return self._now

    def clock(self) -> float:
        """The virtual time, as a `time.monotonic` stand-in for the scheduler."""
        return self._now

    def add(self, device: Device, on_done: OnDone, run_op: RunOp | None = None) -> FakeExecutor:
        if device.name in self.executors:
            raise ValueError(f"{device.name} already has an executor")
        ex = FakeExecutor(device, on_done, self, run_op)
        self.executors[device.name] = ex
        self._share_hosts()
        return ex

    def _share_hosts(self) -> None:
        inter = self.interference
        if inter is None or inter.is_neutral():
            return
        exs = list(self.executors.values())
        host = inter.sharing([e.device.name for e in exs])
        self._hosts = [_Host([e for e, h in zip(exs, host, strict=True) if h == k],
                             len(inter.classes)) for k in range(max(host) + 1)]
        for e, h in zip(exs, host, strict=True):
            e.host = h

    def started(self, ex: FakeExecutor, op: OpInstance, now: float) -> None:
        """`ex` started `op` at `now`: time its completion (at once when alone on its host)."""
        if ex.host < 0:
            self.push(now + op.est_s, ex, op)
            return
        assert self.interference is not None
        ex._cls = self.interference.class_index(op.name)
        ex._rem_s, ex._last, ex._slow = op.est_s, now, 0.0
        host = self._hosts[ex.host]
        if ex._cls >= 0:
            host.counts[ex._cls] += 1
        host.fresh.append(ex)
        host.dirty = True

    def _retime(self) -> None:
        """Re-time the running ops of every host whose running classes changed (see the
        module docstring; `scheduler.sim.simulator` does the same)."""
        assert self.interference is not None
        for host in self._hosts:
            if not host.dirty:
                continue
            host.dirty = False
            key = tuple(host.counts)
            if key == host.seen:
                todo = [e for e in host.members if e in host.fresh]
            else:
                host.seen = key
                todo = [e for e in host.members if e.running is not None]
            host.fresh.clear()
            for e in todo:
                s = self.interference.factor(e._cls, host.counts)
                if s != e._slow:
                    if e._slow > 0.0:
                        e._rem_s = settle(e._rem_s, e._last, e._slow, self._now)
                    e._last, e._slow = self._now, s
                    assert e.running is not None
                    self.push(finish_at(self._now, e._rem_s, s), e, e.running)

    def push(self, t: float, ex: FakeExecutor, op: OpInstance | None) -> None:
        """An event at `t`: the completion of `ex`'s running `op` (its result as `ex` holds
        it), or with `op=None` a wake-up of `ex` (a Recv retry is due)."""
        self._seq += 1
        prio = int(op.priority) if op is not None else -1
        out, err = ex._result if op is not None else (None, None)
        ev = _Event(t, prio, self._seq, ex, op, out, err)
        if op is not None:
            ex._event = ev
        heapq.heappush(self._heap, ev)

    def _peek(self) -> _Event | None:
        """The next live event, dropping completions that were re-timed since."""
        heap = self._heap
        while heap and heap[0].op is not None and heap[0] is not heap[0].executor._event:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def poke(self) -> None:
        """New work arrived: wake `drive` if it waits."""
        if self._poked is not None:
            self._poked.set()

    def next_time(self) -> float | None:
        """When the next event happens (None when nothing is in flight)."""
        ev = self._peek()
        return ev.time if ev is not None else None

    def step(self) -> bool:
        """Dispatch at `now`, then handle one event. False when no event is left."""
        self._dispatch_all()
        if self._peek() is None:
            return False
        ev = heapq.heappop(self._heap)
        self._now = ev.time
        if ev.op is None:
            ev.executor._wake_at = None
            self._dispatch_all()
            return True
        ex = ev.executor
        ex._complete(ev)
        if ex.host >= 0:
            host = self._hosts[ex.host]
            if ex._cls >= 0:
                host.counts[ex._cls] -= 1
            host.dirty = True
        self._dispatch_all()
        ev.executor._on_done(ev.op)
        return True

    def run_until(self, t: float) -> None:
        """Handle every event up to time `t`, then set the clock to `t`."""
        self._dispatch_all()
        while (ev := self._peek()) is not None and ev.time <= t:
            self.step()
        self._now = max(self._now, t)
        self._dispatch_all()

    def run_until_idle(self, max_steps: int = 1_000_000) -> float:
        """Run until no op is running or due; returns `now`.

        Ops still queued then wait on deps that are not done (failed, or outside the
        cluster). Raises RuntimeError after `max_steps` events (a Recv that never fits).
        """
        for _ in range(max_steps):
            if not self.step():
                return self._now
        raise RuntimeError(f"virtual cluster still busy after {max_steps} events")

    async def drive(self, forever: bool = False) -> None:
        """Advance virtual time whenever every other task of the loop is blocked.

        Returns once idle, or with `forever` waits for the next enqueue instead (cancel
        the task to stop it). Completions are delivered in the loop's thread.
        """
        self._poked = asyncio.Event()
        try:
            while True:
                await _settle()
                self._poked.clear()
                if self.step():
                    continue
                if not forever:
                    return
                await self._poked.wait()
        finally:
            self._poked = None

    def _dispatch_all(self) -> None:
        for ex in self.executors.values():
            ex._dispatch(self._now)
        if self._hosts:
            self._retime()


class _Host:
    """A host that executors share: running op classes, ops started since the last
    re-timing, the class counts then."""

    def __init__(self, members: list[FakeExecutor], num_classes: int) -> None:
        self.members = members  # in the order they were added
        self.counts = [0] * num_classes
        self.seen = tuple(self.counts)
        self.fresh: list[FakeExecutor] = []
        self.dirty = False


async def _settle() -> None:
    """Yield until the loop has no other callback ready (every other task is blocked)."""
    loop = asyncio.get_running_loop()
    # NOTE: CPython's loops keep ready callbacks in `_ready`; elsewhere (uvloop) we can
    # only yield a fixed number of turns.
    ready = getattr(loop, "_ready", None)
    for _ in range(SETTLE_ROUNDS if ready is not None else 50):
        await asyncio.sleep(0)
        if ready is not None and not ready:
            return
