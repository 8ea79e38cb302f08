"""When a background re-profile may time its next op: not while interactive work waits or runs.

A re-profile of a device kind times the whole sweep again (tens of seconds on a
small CPU host); each timed op takes the device from the requests being served. It
already waits for no op in flight before each op (`PairProfiler`), but between
an interactive request's ops that left it room to start ops that then delayed the
next ones. So the sweep is deferred as a whole while any interactive (high-class)
request is queued or admitted, and for `QUIET_S` after the last one was seen
(IDE traffic comes in bursts); low-class work (batches) does not hold it back, so a
re-profile still finishes under steady batch load, between its ops.

`may_reprofile` is the pure decision; `ReprofileGate` keeps the one piece of
memory it needs (when interactive work was last seen) and the time deferred.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

QUIET_S = 1.0  # after the last interactive request was seen, before a re-profile goes on


@dataclass(frozen=True, slots=True)
class ServingLoad:
    """What the scheduler serves now, as a re-profile sees it."""

    interactive_waiting: int = 0  # high-class requests queued (waiting or swapped out)
    interactive_running: int = 0  # high-class requests admitted and unfinished


def may_reprofile(load: ServingLoad, since_interactive_s: float,
                  quiet_s: float = QUIET_S) -> bool:
    """Whether a re-profile may go on: no interactive request queued or admitted, and none
    seen for `quiet_s` (`since_interactive_s`: seconds since one was, inf: never)."""
    return (load.interactive_waiting == 0 and load.interactive_running == 0
            and since_interactive_s >= quiet_s)


def defer_reason(load: ServingLoad) -> str:
    """Why a re-profile waits, for its log line."""
    if load.interactive_waiting or load.interactive_running:
        return (f"{load.interactive_waiting} interactive request(s) waiting, "
                f"{load.interactive_running} running")
    return "interactive work ended moments ago"


class ReprofileGate:
    """`may_reprofile` over time: remembers when interactive work was last seen and adds up
    how long the re-profile was held back (`deferred_s`)."""

    def __init__(self, quiet_s: float = QUIET_S) -> None:
        self.quiet_s = quiet_s
        self.last_interactive = -math.inf  # monotonic s the gate last saw interactive work
        self.deferred_s = 0.0  # held back, over every `check` since the last `reset`
        self._closed_since: float | None = None

    def check(self, load: ServingLoad, now: float) -> bool:
        """Open (True) or closed at `now`, given `load`; call it as often as it may change."""
        if load.interactive_waiting or load.interactive_running:
            self.last_interactive = now
        is_open = may_reprofile(load, now - self.last_interactive, self.quiet_s)
        if is_open and self._closed_since is not None:
            self.deferred_s += now - self._closed_since
            self._closed_since = None
        elif not is_open and self._closed_since is None:
            self._closed_since = now
        return is_open

    def held_s(self, now: float) -> float:
        """`deferred_s`, plus the current stretch if the gate is closed at `now`."""
        return self.deferred_s + (now - self._closed_since if self._closed_since is not None
                                  else 0.0)

    def reset(self) -> None:
        """A new job: nothing deferred yet."""
        self.deferred_s, self._closed_since = 0.0, None
