"""When an estimator has drifted far enough from its profile to profile it again.

An estimator's level is its measured over profiled time (median of a full window);
past `DRIFT_THRESHOLD`, and where the drift moves its median time by `DRIFT_MIN_S`
or more, `DriftWatch` hands its kind (or transfer pair) out for a re-profile, then
waits before it may again.
"""

from __future__ import annotations

from scheduler.cost.linear import LinearEstimator

DRIFT_THRESHOLD = 0.15  # |measured / base - 1| (median over a full window) that re-profiles
DRIFT_MIN_S = 5e-4  # a drift that moves the op's median time by less re-profiles nothing
REPROFILE_COOLDOWN_S = 300.0  # of op time between re-profiles of one kind or pair (doubles
# while the drift persists after one)


class DriftWatch:
    """Hands out an estimator's kind (or pair) for a re-profile once its level (measured
    over profiled time, median of a full window) is off by more than `threshold`; then
    waits `cooldown_s` of op time before it may again, twice as long after each time
    while the drift persists. Checks need the observations' times."""

    def __init__(self, threshold: float = DRIFT_THRESHOLD,
                 cooldown_s: float = REPROFILE_COOLDOWN_S) -> None:
        self.threshold, self.cooldown_s = threshold, cooldown_s
        self._next: dict[object, float] = {}  # key -> earliest op time it may fire again
        self._wait: dict[object, float] = {}  # key -> the cooldown after its next firing
        self.fired: list[object] = []  # keys handed out, in order

    def check(self, est: LinearEstimator, key: object, at: float | None) -> bool:
        level = est.drift()
        if level is None or at is None:
            return False
        if abs(level - 1.0) <= self.threshold:
            self._wait.pop(key, None)  # back where it was profiled: a later drift is new
            return False
        if abs(1.0 - 1.0 / level) * est.median_seconds() < DRIFT_MIN_S:
            return False  # NOTE: a 35 us embedding read 1.5x its profile by Python overhead alone
        if at < self._next.get(key, float("-inf")):
            return False
        wait = self._wait.get(key, self.cooldown_s)
        self._next[key], self._wait[key] = at + wait, 2 * wait
        self.fired.append(key)
        return True
