"""The scheduler's interface as the gateway sees it, and the stats it exports."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from scheduler.core.ieg import Request, TokenEvent

NO_DEVICE = "no device is available"  # starts the error of requests ended by it (HTTP 503)
ROUND_BUCKETS_S = (1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5)


@dataclass(slots=True)
class Histogram:
    """Cumulative since start: counts per bucket (upper bounds in seconds, then +Inf)."""

    bounds_s: tuple[float, ...] = ROUND_BUCKETS_S
    counts: list[int] = field(default_factory=lambda: [0] * (len(ROUND_BUCKETS_S) + 1))
    sum_s: float = 0.0
    count: int = 0

    def observe(self, seconds: float) -> None:
        i = next((k for k, b in enumerate(self.bounds_s) if seconds <= b), len(self.bounds_s))
        self.counts[i] += 1
        self.sum_s += seconds
        self.count += 1

    def copy(self) -> Histogram:
        return Histogram(self.bounds_s, list(self.counts), self.sum_s, self.count)


@dataclass(slots=True)
class SchedulerStats:
    """A point-in-time view for /metrics. Keys of dicts are noted per field."""

    num_running: dict[tuple[str, str], int] = field(default_factory=dict)  # (tenant, class)
    num_waiting: dict[tuple[str, str], int] = field(default_factory=dict)  # (tenant, class)
    kv_cache_usage: float = 0.0  # used / total KV blocks over all devices, in [0, 1]
    num_preemptions: dict[tuple[str, str], int] = field(default_factory=dict)  # cumulative
    kv_swapped_bytes: int = 0  # KV copied to host memory by preemptions, cumulative
    kv_recomputed_tokens: int = 0  # tokens of KV dropped by preemptions to recompute
    slo_attainment: dict[str, float] = field(default_factory=dict)  # class -> fraction
    device_busy_ratio: dict[str, float] = field(default_factory=dict)  # device -> fraction
    round_seconds: Histogram = field(default_factory=Histogram)  # decision + apply, per round
    estimator_mape: dict[str, float] = field(default_factory=dict)  # estimator -> fraction
    estimator_cov: dict[str, float] = field(default_factory=dict)  # estimator -> sweep's CoV
    estimator_level: dict[str, float] = field(default_factory=dict)  # estimator -> measured /
    # profiled time (median of recent ops; 1.0 while the machine runs as profiled)
    reprofiles: dict[str, int] = field(default_factory=dict)  # kind or pair -> cumulative
    reprofiling: bool = False  # a background profile is running
    slowdown: dict[tuple[str, str], float] = field(default_factory=dict)  # (op class, class
    # running beside it on another device of the host) -> co-location slowdown
    first_token_factor: dict[str, float] = field(default_factory=dict)  # placement kind ->
    # measured / predicted first-token wait of its recent plans (scheduler/round/calibration.py)
    fairness_jain: dict[str, float] = field(default_factory=dict)  # class -> Jain's index of
    # the tokens each of its tenants was served (scheduler/core/fairness.py)
    queued_tokens: dict[str, int] = field(default_factory=dict)  # class -> prompt tokens waiting
    errors_total: int = 0  # exceptions caught in rounds and completion handlers, cumulative
    healthy: bool = True  # False while rounds keep failing, or once the task or an executor died
    health_detail: str | None = None  # why it is not healthy
    device_up: dict[str, bool] = field(default_factory=dict)  # device -> its executor is up
    device_detail: dict[str, dict[str, Any]] = field(default_factory=dict)  # device -> state,
    # times lost, last error (remote devices)


@dataclass(frozen=True, slots=True)
class DirectTiming:
    """One greedy request's operator chain run directly on a device (`time_direct`)."""

    device: str
    first_token_s: float  # the prefill and the first token's sampling
    total_s: float  # every step, to the last token


class DirectUnavailable(Exception):
    """No device by that name, or it runs no executor thread in this process."""


class SchedulerAPI(Protocol):
    """What `gateway` calls. `scheduler.Scheduler` implements it; `FakeScheduler` too."""

    def submit(self, request: Request) -> AsyncIterator[TokenEvent]:
        """Admit a request (raises RequestTooLarge / Overloaded) and stream its tokens."""
        ...

    def abort(self, request_id: str, reason: str) -> None:
        """End a request early (`stop`, `abort`, ...); frees its KV blocks. Idempotent."""
        ...

    def stats(self) -> SchedulerStats: ...

    def snapshot(self) -> dict[str, Any]:
        """JSON view of the GMG and devices for /admin/gmg."""
        ...

    def timeline(self, since: float) -> list[dict[str, Any]]:
        """Recent op executions (device, op, class, start, end) since monotonic time `since`."""
        ...

    async def time_direct(self, prompt_ids: list[int], max_tokens: int,
                          device: str | None = None) -> DirectTiming:
        """A request's operator chain with no serving path around it: `max_tokens` greedy
        steps of `prompt_ids`, timed on `device`'s executor thread (default: the first
        device) between its ops. Raises `DirectUnavailable`."""
        ...

    async def start(self) -> None: ...

    async def stop(self, drain: bool = True, timeout_s: float = 30.0) -> None: ...
