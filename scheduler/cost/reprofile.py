"""Profiling in the background what the estimators lack or lost.

Two kinds of job, one at a time on a supervised task, their timing on a worker
thread (a kind's timed ops on the device's executor thread, where it has one) and
their fit on the event loop:

- a device pair the start-up fit lacks (or whose transfers drifted): the
  estimators price it with a conservative fallback meanwhile and hand it out;
  its copies are timed and its transfer estimator fitted.
- a device kind whose ops drifted from their profile (`Estimators.on_drift`):
  the sweep is timed again on a device of that kind and becomes the base of
  every op of the kind (`Estimators.rebase_kind`); of a model set, every member's
  chain in turn (`Chain`), each refitting its ops under its names in the set.
  Each op of it waits until the scheduler has no op in flight (`idle`), so it
  overlaps the serving executors by one op at most (work issued while it runs);
  under constant load it waits, and
  the online refit tracks the drift meanwhile. The whole sweep is also deferred
  while interactive work waits or runs (`scheduler.cost.deferral`), and its line
  in the log says what it timed, how long it took and how long it was deferred.

Each result is also written into the start-up fit's cache (`Estimators.cache_file`),
so that the next start begins from what the machine measured last rather than
drifting from an old profile and re-profiling again.

A failure is logged and counted; the estimate in place stays, and the job is
tried again at the next request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from models.cpu import in_own_thread
from models.loader import Model
from scheduler.cost.deferral import ReprofileGate, ServingLoad, defer_reason
from scheduler.cost.estimators import Estimators
from scheduler.cost.oprunner import OnDevice
from scheduler.cost.profiling import Sweep, fit_kind, profile_pair, remember, take_kind, take_pair

logger = logging.getLogger(__name__)

IDLE_POLL_S = 0.005
GATE_POLL_S = 0.05  # how often a waiting or running re-profile reads the serving load


@dataclass(frozen=True, slots=True)
class Chain:
    """One model's chain that a kind's re-profile times: a set's member (models/modelset.py)."""

    model: Model  # the member's own model (its ops under their own names)
    prefix: str = ""  # its ops' names in the estimators: "NAME/" for a set's member
    cache_file: Path | None = None  # its start-up fit's cache (None: not written back)
    devices: tuple[str, ...] | None = None  # where it runs; None: every device


class Aborted(Exception):
    """The re-profile's task was cancelled (the server stops): its thread ends early."""


class PairProfiler:
    """Profiles device pairs handed to `request` and device kinds handed to `request_kind`,
    on a supervised background task (see the module docstring)."""

    def __init__(self, model: Model, est: Estimators, sweep: Sweep | None = None,
                 devices: Sequence[str] = (), idle: Callable[[], bool] | None = None,
                 threads: int = 1, on_device: Callable[[str], OnDevice | None] | None = None,
                 load: Callable[[], ServingLoad] | None = None,
                 chains: Sequence[Chain] = ()) -> None:
        self.model, self.est, self.sweep = model, est, sweep or Sweep()
        # NOTE: a set's re-profile times each member's chain; one model's is `model` itself
        self.chains = list(chains) or [Chain(model)]
        self.threads = threads  # intra-op threads of a kind's sweep (the executors')
        # where a device's timed ops run (its executor's thread), None: on the sweep's thread
        self.on_device = on_device or (lambda device: None)
        self.devices = list(devices)  # where a kind's sweep may run
        self.is_idle = idle or (lambda: True)  # no op in flight (read from the worker thread)
        self.load = load or ServingLoad  # interactive work now (read on the event loop)
        self.gate = ReprofileGate()  # defers a kind's sweep while interactive work is served
        self._open = True  # the gate, as the loop last read it (the worker thread reads this)
        self._todo: deque[tuple[str, str] | str] = deque()  # pairs, or device kinds
        self._task: asyncio.Task[None] | None = None
        self._abort = threading.Event()
        self.done: list[tuple[str, str]] = []  # pairs fitted, in order
        self.kinds_done: list[str] = []  # kinds re-profiled, in order
        self.failures = 0

    @property
    def busy(self) -> bool:
        """A background profile is queued or running."""
        return self._task is not None and not self._task.done()

    def request(self, pairs: list[tuple[str, str]]) -> None:
        """Queue pairs to profile (call on the event loop). A pair with a remote device
        (`NODE/...`) is left out: its copies run between Ray actors, not here."""
        self._queue([p for p in pairs if not any("/" in d for d in p)])

    def request_kind(self, kind: str) -> None:
        """Queue a device kind whose ops to profile again (call on the event loop)."""
        self._queue([kind])

    def _queue(self, jobs: Sequence[tuple[str, str] | str]) -> None:
        if self._abort.is_set():
            return  # NOTE: stopped: the executors it would time on are gone
        self._todo.extend(j for j in jobs if j not in self._todo)
        if self._todo and (self._task is None or self._task.done()):
            self._task = asyncio.create_task(self._run(), name="slicegate-reprofiler")
            self._task.add_done_callback(self._log_failure)

    async def stop(self) -> None:
        """Drop what is queued and end what runs (the server stops; call before the
        executors stop): a sweep's thread ends at its next op instead of timing it on a
        stopped executor, and a drift seen later queues nothing."""
        self._abort.set()
        if self._todo:
            logger.info("re-profile of %s dropped: the server stops (deferred %.1f s for "
                        "interactive work so far)", ", ".join(map(str, self._todo)),
                        self.gate.held_s(time.monotonic()))
        self._todo.clear()
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while self._todo:
            job = self._todo[0]
            try:
                if isinstance(job, str):
                    await self._kind(job)
                else:
                    await self._pair(*job)
            except asyncio.CancelledError:
                self._abort.set()
                raise
            self._todo.popleft()

    async def _pair(self, src: str, dst: str) -> None:
        nbytes, seconds = await asyncio.to_thread(profile_pair, self.model, src, dst,
                                                  self.sweep)
        self.est.fit_transfer(src, dst, nbytes, seconds)
        self.done.append((src, dst))
        logger.info("profiled transfers %s->%s in the background", src, dst)
        await self._remember(take_pair(src, dst, nbytes, seconds))

    async def _kind(self, kind: str) -> None:
        for chain in self.chains:
            await self._chain_kind(kind, chain)
        self.kinds_done.append(kind)

    async def _chain_kind(self, kind: str, chain: Chain) -> None:
        device = next((d for d in self.devices if self.est.kind_of(d) == kind
                       and (chain.devices is None or d in chain.devices)), None)
        if device is None:
            logger.warning("no device of kind %s to re-profile %son", kind,
                           f"model {chain.prefix[:-1]!r} " if chain.prefix else "")
            return
        fresh = Estimators({device: kind})
        t0 = time.perf_counter()
        self.gate.reset()
        await self._until_open(kind)
        watch = asyncio.create_task(self._watch_gate(), name="slicegate-reprofile-gate")
        try:
            await asyncio.to_thread(self._fit_kind, fresh, kind, device, chain.model)
        finally:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch  # NOTE: re-raises the watch's own failure, logged as the job's
        self.est.rebase_kind(kind, fresh, chain.prefix)
        s = self.sweep
        logger.info("re-profiled the ops of %s%s on %s in the background: %d ops x %d shapes "
                    "x %d repeats in %.1f s, of which %.1f s deferred for interactive work",
                    kind, f" of model {chain.prefix[:-1]!r}" if chain.prefix else "", device,
                    len(chain.model.template.ops), len(s.cases()), s.repeats,
                    time.perf_counter() - t0, self.gate.deferred_s)
        path = chain.cache_file if chain.prefix else self.est.cache_file
        await self._remember(take_kind(kind, fresh), path)

    def _read_gate(self) -> bool:
        self._open = self.gate.check(self.load(), time.monotonic())
        return self._open

    async def _until_open(self, kind: str) -> None:
        """Before a kind's sweep: wait while interactive work is served (logged once)."""
        if self._read_gate():
            return
        logger.info("re-profile of %s deferred: %s", kind, defer_reason(self.load()))
        while not self._read_gate():
            await asyncio.sleep(GATE_POLL_S)

    async def _watch_gate(self) -> None:
        """While a sweep runs: keep `_open` current for its thread (`_wait_idle`)."""
        while True:
            self._read_gate()
            await asyncio.sleep(GATE_POLL_S)

    async def _remember(self, update: Callable[[Estimators], object],
                        path: Path | None = None) -> None:
        """Write `update` into the fit cached at `path` (default: the estimators' own)."""
        path = path or self.est.cache_file
        if path is None:
            return
        try:
            await asyncio.to_thread(remember, path, update)
        except (OSError, ValueError, KeyError) as e:  # the live fit has it: only a restart loses
            logger.warning("could not write the re-profile into %s: %s", path, e)

    def _fit_kind(self, fresh: Estimators, kind: str, device: str, model: Model) -> None:
        # NOTE: each timed op runs on the device's executor thread where it has one: a
        # sweep on a thread of its own at the executors' count ran beside their OpenMP
        # teams, and libgomp then sleeps every team's workers between parallel regions
        # (the fit read 1.5x the live ops, and the live ops slowed while it ran).
        # Otherwise on a thread that ends with the sweep, not on the loop's pool thread.
        on_device = self.on_device(device)
        in_own_thread(1 if on_device else self.threads,
                      lambda: fit_kind(fresh, model, kind, device, self.sweep,
                                       time.perf_counter, self._wait_idle, on_device))

    def _wait_idle(self) -> None:
        """Before each op of a kind's sweep (worker thread): wait for no op in flight and no
        interactive work (the gate as the loop read it)."""
        while not (self._open and self.is_idle()):
            if self._abort.is_set():
                raise Aborted
            time.sleep(IDLE_POLL_S)
        if self._abort.is_set():
            raise Aborted

    async def idle(self) -> None:
        """Wait until nothing is queued (for tests)."""
        while self._task is not None and not self._task.done():
            await asyncio.sleep(0.01)

    def _log_failure(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.failures += 1
            logger.error("background profiling of %s failed; the estimate in place stays",
                         self._todo[0] if self._todo else "?", exc_info=task.exception())
