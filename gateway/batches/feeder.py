"""The feeder: one supervised task that moves batches along and feeds their lines to the scheduler.

Each step advances every unfinished batch (validate, expire, cancel,
finalize) and then feeds pending lines, round-robin over tenants, while
fewer than `max_in_flight` lines are unfinished and fewer than `max_waiting`
of them still wait for their first token. A line that has not started is
sitting in the scheduler's low-priority queue, so feeding pauses exactly
when the devices have no idle slice for batch work, and the waiting queues
stay short for everyone else.

A step that raises is logged and retried with backoff; after
`MAX_STEP_FAILURES` in a row the feeder stops and `/health` says so. A batch
whose own step keeps failing is marked `failed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.batches.context import BatchContext
from gateway.batches.files import FileStorage
from gateway.batches.finalize import close_unanswered, write_files
from gateway.batches.lines import Line, read_input
from gateway.batches.runner import (
    Answered,
    Outcome,
    Retry,
    Started,
    close_job,
    finish,
    prepare,
)
from gateway.batches.store import Store
from gateway.batches.types import BatchRecord, BatchStatus, LineState, result_line
from gateway.config import BatchSettings
from gateway.errors import ApiError
from gateway.tenants import Tenant, TenantsConfig

logger = logging.getLogger("gateway.batches")

MAX_STEP_FAILURES = 5  # steps failing in a row before the feeder gives up
MAX_BATCH_FAILURES = 3  # steps of one batch failing before that batch is marked failed
IDLE_WAIT_S = 1.0  # nothing waiting: look again at least this often (expiry, new batches)
BUSY_WAIT_S = 0.02  # lines waiting for their first token: look this often
PREFETCH_LINES = 16
_ACTIVE = (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS, BatchStatus.CANCELLING,
           BatchStatus.FINALIZING)


def tenant_named(tenants: TenantsConfig, name: str) -> Tenant | None:
    if not tenants.auth_enabled:
        default = tenants.default_tenant
        return default if default.name == name else None
    return next((t for t in tenants.tenants if t.name == name), None)


@dataclass(slots=True, eq=False)
class _Running:
    """A submitted line."""

    batch_id: str
    line: Line
    started: Started
    task: asyncio.Task[None] | None = None

    @property
    def has_started(self) -> bool:
        """A first token came: the line has left the scheduler's waiting queue."""
        return any(g.first_token_time is not None for g in self.started.job.generations)


@dataclass(slots=True)
class _Cursor:
    """Where feeding one in-progress batch stands."""

    batch: BatchRecord
    tenant: Tenant
    after: int = 0  # lines up to this number were handed out
    buffer: deque[Line] = field(default_factory=deque)
    retry: deque[Line] = field(default_factory=deque)
    not_before: float = 0.0  # monotonic s; set by a Retry (quota, overload)

    def next_line(self, store: Store) -> Line | None:
        if self.retry:
            return self.retry.popleft()
        if not self.buffer:
            self.buffer.extend(store.pending_lines(self.batch.id, self.after, PREFETCH_LINES))
            if self.buffer:
                self.after = self.buffer[-1][0]
        return self.buffer.popleft() if self.buffer else None

    @property
    def holds_lines(self) -> bool:
        return bool(self.retry or self.buffer)


class Feeder:
    """Runs the batches of one data dir (see the module docstring)."""

    def __init__(self, context: BatchContext, store: Store, storage: FileStorage,
                 settings: BatchSettings, clock: Callable[[], float] = time.time) -> None:
        self._context, self._store, self._storage = context, store, storage
        self._settings = settings
        self._clock = clock  # unix s, for the batch timestamps and expiry
        self._cursors: dict[str, _Cursor] = {}
        self._running: dict[tuple[str, int], _Running] = {}
        self._fed: dict[str, int] = {}  # tenant -> feeding turn it was last served at
        self._turn = 0
        self._batch_failures: dict[str, int] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.error: str | None = None  # the last failure, until a step succeeds
        self.dead = False
        self._stopping = False

    # ---- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="slicegate-batch-feeder")
        self._task.add_done_callback(self._on_exit)

    async def stop(self) -> None:
        """Stop feeding; lines in flight are aborted and stay pending for the next start."""
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._abort(lambda r: True)

    def wake(self) -> None:
        self._wake.set()

    @property
    def healthy(self) -> bool:
        return not self.dead and self.error is None

    @property
    def num_in_flight(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return sum(not r.has_started for r in self._running.values())

    def _on_exit(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        self.dead = True
        if exc is not None and self.error is None:
            self.error = f"{type(exc).__name__}: {exc}"
        logger.error("batch feeder stopped: %s; batches wait for a restart", self.error)

    async def _loop(self) -> None:
        failures = 0
        while not self._stopping:
            try:
                await self._step()
                failures, self.error = 0, None
            except Exception as exc:
                failures += 1
                self.error = f"{type(exc).__name__}: {exc}"
                logger.exception("batch feeder step failed (%d in a row)", failures)
                if failures >= MAX_STEP_FAILURES:
                    return
            await self._pause(failures)

    async def _pause(self, failures: int) -> None:
        if failures:
            await asyncio.sleep(min(0.1 * 2 ** failures, 5.0))
            return
        timeout = BUSY_WAIT_S if self.num_waiting else IDLE_WAIT_S
        now = time.monotonic()
        blocked = [c.not_before - now for c in self._cursors.values() if c.not_before > now]
        if blocked:
            timeout = min(timeout, max(min(blocked), BUSY_WAIT_S))
        # NOTE: asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
        # that arrives as the event is set, and stop() would then wait forever.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._wake.wait()
        self._wake.clear()

    # ---- batches -------------------------------------------------------------------------

    async def _step(self) -> None:
        active = self._store.batches_in(_ACTIVE)
        for batch in active:
            try:
                await self._advance(batch)
                self._batch_failures.pop(batch.id, None)
            except Exception as exc:
                await self._on_batch_error(batch, exc)
        gone = set(self._cursors) - {b.id for b in active if b.status is BatchStatus.IN_PROGRESS}
        for batch_id in gone:
            del self._cursors[batch_id]
        self._feed()

    async def _advance(self, batch: BatchRecord) -> None:
        status = batch.status
        if status is BatchStatus.VALIDATING:
            await self._validate(batch)
        elif status is BatchStatus.CANCELLING:
            await self._end(batch, BatchStatus.CANCELLED)
        elif status is BatchStatus.FINALIZING:
            await self._finalize(batch.id, batch.final_status or BatchStatus.COMPLETED)
        elif self._clock() >= batch.expires_at:
            await self._end(batch, BatchStatus.EXPIRED)
        elif self._is_done(batch):
            self._store.update_batch(batch.id, status=BatchStatus.FINALIZING,
                                     finalizing_at=int(self._clock()),
                                     final_status=BatchStatus.COMPLETED)
            await self._finalize(batch.id, BatchStatus.COMPLETED)
        elif batch.id not in self._cursors:
            self._cursors[batch.id] = self._cursor(batch)

    def _cursor(self, batch: BatchRecord) -> _Cursor:
        tenant = tenant_named(self._context.tenants.current, batch.tenant)
        if tenant is None:
            raise RuntimeError(f"tenant {batch.tenant!r} is no longer configured")
        return _Cursor(batch, tenant)

    def _is_done(self, batch: BatchRecord) -> bool:
        cursor = self._cursors.get(batch.id)
        if cursor is not None and cursor.holds_lines:
            return False
        if any(r.batch_id == batch.id for r in self._running.values()):
            return False
        return self._store.count_pending(batch.id) == 0

    async def _validate(self, batch: BatchRecord) -> None:
        now = int(self._clock())
        file = self._store.get_file(batch.input_file_id)
        if file is None:
            self._fail(batch, [{"code": "invalid_file", "message": f"The input file "
                                f"{batch.input_file_id} no longer exists.",
                                "param": "input_file_id", "line": None}], now)
            return
        lines, errors = await asyncio.to_thread(read_input, self._storage.path(file.id),
                                                batch.endpoint)
        if errors:
            self._fail(batch, errors, now)
        elif await asyncio.to_thread(self._store.start_batch, batch.id, lines, now):
            self._wake.set()  # its lines are ready: feed them at the next step, not a second on
            logger.info("batch %s of %s: %d lines in progress", batch.id, batch.tenant,
                        len(lines))

    def _fail(self, batch: BatchRecord, errors: list[dict[str, object]], now: int) -> None:
        self._store.update_batch(batch.id, status=BatchStatus.FAILED, failed_at=now,
                                 errors=errors)
        logger.warning("batch %s of %s failed: %s", batch.id, batch.tenant,
                       errors[0]["message"] if errors else "")

    async def _end(self, batch: BatchRecord, final: BatchStatus) -> None:
        """Cancel or expire: abort its running lines, close the rest, write the files."""
        await self._abort(lambda r: r.batch_id == batch.id)
        self._cursors.pop(batch.id, None)
        close_unanswered(self._store, batch, final)
        if final is BatchStatus.EXPIRED:
            self._store.update_batch(batch.id, status=BatchStatus.FINALIZING,
                                     finalizing_at=int(self._clock()), final_status=final)
        await self._finalize(batch.id, final)

    async def _finalize(self, batch_id: str, final: BatchStatus) -> None:
        self._cursors.pop(batch_id, None)
        await asyncio.to_thread(write_files, self._store, self._storage, batch_id, final,
                                int(self._clock()))
        done = self._store.get_batch(batch_id)
        assert done is not None
        logger.info("batch %s of %s %s: %d completed, %d failed", batch_id, done.tenant,
                    final.value, done.completed, done.failed)

    async def _on_batch_error(self, batch: BatchRecord, exc: Exception) -> None:
        count = self._batch_failures.get(batch.id, 0) + 1
        self._batch_failures[batch.id] = count
        logger.error("batch %s: step failed (%d of %d): %s", batch.id, count,
                     MAX_BATCH_FAILURES, exc, exc_info=exc)
        if count < MAX_BATCH_FAILURES:
            return
        await self._abort(lambda r: r.batch_id == batch.id)
        self._cursors.pop(batch.id, None)
        self._fail(batch, [{"code": "internal_error", "message": f"The server failed to run "
                            f"the batch: {type(exc).__name__}: {exc}", "param": None,
                            "line": None}], int(self._clock()))

    # ---- lines ---------------------------------------------------------------------------

    def _feed(self) -> None:
        if self._context.lifecycle.draining:
            return
        settings, skip = self._settings, set[str]()
        while (len(self._running) < settings.max_in_flight
               and self.num_waiting < settings.max_waiting):
            cursor = self._pick(skip)
            if cursor is None:
                return
            line = cursor.next_line(self._store)
            if line is None:
                skip.add(cursor.batch.id)
                continue
            self._start(cursor, line)

    def _pick(self, skip: set[str]) -> _Cursor | None:
        """The next batch to feed: tenants in turn, then a tenant's batches oldest first."""
        now = time.monotonic()
        ready = [c for c in self._cursors.values()
                 if c.batch.id not in skip and c.not_before <= now]
        if not ready:
            return None
        return min(ready, key=lambda c: (self._fed.get(c.tenant.name, -1), c.batch.created_at))

    def _start(self, cursor: _Cursor, line: Line) -> None:
        self._turn += 1
        self._fed[cursor.tenant.name] = self._turn
        try:
            outcome = prepare(self._context, cursor.tenant, cursor.batch.endpoint, line[1], line[2])
        except Exception as exc:  # a bug on the generation path: this line gets a 500
            logger.exception("batch %s line %d: failed to start", cursor.batch.id, line[0])
            outcome = _internal_error(line, exc)
        if not isinstance(outcome, Started):
            self._settle(cursor, line, outcome)
            return
        running = _Running(cursor.batch.id, line, outcome)
        self._running[(cursor.batch.id, line[0])] = running
        running.task = asyncio.create_task(self._run_line(cursor, running),
                                           name=f"batch-line-{cursor.batch.id}-{line[0]}")

    async def _run_line(self, cursor: _Cursor, running: _Running) -> None:
        line = running.line
        try:
            outcome = await finish(running.started, line[1])
        except Exception as exc:  # NOTE: CancelledError passes: the line stays pending
            logger.exception("batch %s line %d failed", running.batch_id, line[0])
            outcome = _internal_error(line, exc)
        finally:
            self._running.pop((running.batch_id, line[0]), None)
            self._wake.set()
        self._settle(cursor, line, outcome)

    def _settle(self, cursor: _Cursor, line: Line, outcome: Outcome) -> None:
        if isinstance(outcome, Retry):
            cursor.retry.append(line)
            cursor.not_before = max(cursor.not_before, time.monotonic() + outcome.after_s)
            return
        try:
            self._store.record_line(cursor.batch.id, line[0], outcome.state, outcome.result)
        except Exception as exc:
            logger.exception("batch %s line %d: could not record its result", cursor.batch.id,
                             line[0])
            self.error = f"recording a result failed: {type(exc).__name__}: {exc}"
            cursor.retry.append(line)

    async def _abort(self, which: Callable[[_Running], bool]) -> None:
        entries = [r for r in list(self._running.values()) if which(r)]
        tasks = [r.task for r in entries if r.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for r in entries:  # NOTE: a task cancelled before its first step never closed its job
            close_job(r.started.job)
            self._running.pop((r.batch_id, r.line[0]), None)


def _internal_error(line: Line, exc: Exception) -> Answered:
    error = ApiError(500, f"Internal server error: {type(exc).__name__}.", code="internal_error")
    return Answered(LineState.ERROR, result_line(f"batch_req_{line[0]}", line[1], 500, "",
                                                 error.body()))
