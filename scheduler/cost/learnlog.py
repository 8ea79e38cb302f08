"""Routine learning, summarised: each change at DEBUG where it is learnt, one INFO line a period.

A busy server learns all the time: the estimators refit every 16 observations,
the co-location learner re-estimates every 16 overlapped ops, the first-token
calibration scores every plan. A line per change (~35 INFO lines in a 30 s replay)
buries what an operator needs, so each learner logs its changes at DEBUG on its own
logger and notes them here (`note`), and counters of what happens too often to
note (refits) are read at each summary (`count`). `LearningLog.run`, a supervised
task of the scheduler, writes at most one INFO line per `period_s`: what changed
in that period, how often, and its latest value; nothing when nothing changed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)

SUMMARY_PERIOD_S = 60.0  # at most one INFO summary this often


@dataclass(slots=True)
class _Topic:
    changes: int = 0  # noted since the last summary
    latest: str = ""  # the last change noted


class LearningLog:
    """What the learners changed since the last summary (see the module docstring)."""

    def __init__(self, period_s: float = SUMMARY_PERIOD_S) -> None:
        if period_s <= 0:
            raise ValueError("period_s must be > 0")
        self.period_s = period_s
        self._topics: dict[str, _Topic] = {}
        self._counters: dict[str, Callable[[], int]] = {}  # topic -> its running total
        self._counted: dict[str, int] = {}  # topic -> its total at the last summary
        self.summaries = 0  # INFO lines written
        self.failures = 0  # summaries that raised (logged; the task goes on)

    def note(self, topic: str, change: str) -> None:
        """One change of `topic` (e.g. "co-location slowdowns"), described by `change`."""
        entry = self._topics.setdefault(topic, _Topic())
        entry.changes += 1
        entry.latest = change

    def count(self, topic: str, total: Callable[[], int]) -> None:
        """Report how much `total()` (a running count, e.g. of refits) grew each period."""
        self._counters[topic] = total
        self._counted[topic] = total()

    def summary(self) -> str | None:
        """What changed since the last call, as one line (None: nothing), and start afresh."""
        parts = []
        for topic, total in self._counters.items():
            now = total()
            grown, self._counted[topic] = now - self._counted[topic], now
            if grown > 0:  # NOTE: a counter that restarted (a re-profile) counts nothing
                parts.append(f"{topic} {grown}")
        for topic, entry in self._topics.items():
            if entry.changes:
                parts.append(f"{topic} {entry.changes} change(s), latest {entry.latest}")
        self._topics.clear()
        if not parts:
            return None
        return f"learnt in the last {self.period_s:.0f} s: " + "; ".join(parts)

    async def run(self) -> None:
        """Every `period_s`: log the summary at INFO, if any. A failing summary is logged
        and counted, and the next period tries again."""
        while True:
            await asyncio.sleep(self.period_s)
            try:
                line = self.summary()
            except Exception:
                self.failures += 1
                logger.exception("summarising what the scheduler learnt failed")
                continue
            if line is not None:
                self.summaries += 1
                logger.info("%s", line)
