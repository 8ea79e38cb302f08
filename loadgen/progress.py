"""A one-line progress display on a terminal (nothing when stderr is not a TTY)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable
from typing import TextIO

from loadgen.client import RequestRecord


class Progress:
    """Redraws ``done/total  errors  elapsed`` every ``interval_s`` on ``stream``."""

    def __init__(self, records: list[RequestRecord], total: int | None,
                 elapsed: Callable[[], float], stream: TextIO = sys.stderr,
                 interval_s: float = 0.5, width: int = 30) -> None:
        self._records = records
        self._total = total  # None when a closed loop runs until the duration ends
        self._elapsed = elapsed
        self._stream = stream
        self._interval_s = interval_s
        self._width = width

    def line(self) -> str:
        done = sum(1 for r in self._records if r.end_s is not None)
        errors = sum(1 for r in self._records if r.end_s is not None and not r.ok)
        inflight = len(self._records) - done
        if self._total:
            filled = min(self._width, self._width * done // self._total)
            bar = f"[{'#' * filled}{'.' * (self._width - filled)}] {done}/{self._total}"
        else:
            bar = f"{done} done"
        return f"{bar}  {inflight} in flight  {errors} errors  {self._elapsed():.1f} s"

    async def run(self, stop: asyncio.Event) -> None:
        """Redraw until ``stop`` is set, then end the line."""
        while not stop.is_set():
            self._stream.write("\r" + self.line() + "\x1b[K")
            self._stream.flush()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._interval_s)
        self._stream.write("\r" + self.line() + "\x1b[K\n")
        self._stream.flush()


def wanted(setting: bool | None, stream: TextIO = sys.stderr) -> bool:
    """Whether to show progress: ``setting`` if given, else whether ``stream`` is a terminal."""
    if setting is not None:
        return setting
    return stream.isatty()
