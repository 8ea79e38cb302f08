"""The scheduler's interface as the gateway sees it, and the stats it exports."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from scheduler.ieg import Request, TokenEvent


@dataclass(slots=True)
class SchedulerStats:
    """A point-in-time view for /metrics. Keys of dicts are noted per field."""

    num_running: dict[tuple[str, str], int] = field(default_factory=dict)  # (tenant, class)
    num_waiting: dict[tuple[str, str], int] = field(default_factory=dict)  # (tenant, class)
    kv_cache_usage: float = 0.0  # used / total KV blocks over all devices, in [0, 1]
    num_preemptions: dict[tuple[str, str], int] = field(default_factory=dict)  # cumulative
    slo_attainment: dict[str, float] = field(default_factory=dict)  # class -> fraction
    device_busy_ratio: dict[str, float] = field(default_factory=dict)  # device -> fraction
    simulation_seconds: list[float] = field(default_factory=list)  # new samples since last call
    estimator_mape: dict[str, float] = field(default_factory=dict)  # estimator -> fraction
    healthy: bool = True  # False once an executor died


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

    async def start(self) -> None: ...

    async def stop(self, drain: bool = True, timeout_s: float = 30.0) -> None: ...
