"""Profiling in the background what the start-up fit lacks: transfers between device pairs.

The estimators price an unprofiled pair with a conservative fallback (bytes over
a bandwidth) and hand the pair out; `PairProfiler` times its copies on a worker
thread, one pair at a time, and fits the pair's estimator on the event loop. A
failure is logged and leaves the fallback in place.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

from models.loader import Model
from scheduler.estimators import Estimators
from scheduler.profiling import Sweep, profile_pair

logger = logging.getLogger(__name__)


class PairProfiler:
    """Profiles device pairs handed to `request`, on a supervised background task."""

    def __init__(self, model: Model, est: Estimators, sweep: Sweep | None = None) -> None:
        self.model, self.est, self.sweep = model, est, sweep or Sweep()
        self._todo: deque[tuple[str, str]] = deque()
        self._task: asyncio.Task[None] | None = None
        self.done: list[tuple[str, str]] = []  # pairs fitted, in order

    def request(self, pairs: list[tuple[str, str]]) -> None:
        """Queue pairs to profile (call on the event loop)."""
        self._todo.extend(p for p in pairs if p not in self._todo)
        if self._todo and (self._task is None or self._task.done()):
            self._task = asyncio.create_task(self._run(), name="slicegate-pair-profiler")
            self._task.add_done_callback(_log_failure)

    async def _run(self) -> None:
        while self._todo:
            src, dst = self._todo[0]
            nbytes, seconds = await asyncio.to_thread(profile_pair, self.model, src, dst,
                                                      self.sweep)
            self.est.fit_transfer(src, dst, nbytes, seconds)
            self._todo.popleft()
            self.done.append((src, dst))
            logger.info("profiled transfers %s->%s in the background", src, dst)

    async def idle(self) -> None:
        """Wait until nothing is queued (for tests)."""
        while self._task is not None and not self._task.done():
            await asyncio.sleep(0.01)


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("background transfer profiling failed; the fallback estimate stays",
                     exc_info=task.exception())
