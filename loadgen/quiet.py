"""Whether slicegate runs a background profile (drifted ops re-profiled), read from ``/metrics``.

A background profile's ops share the cores with whatever a benchmark times, for a
minute or two: the overhead probe waits while one runs, and times a pair again when
one ran during it (started, or ended: the count of profiles done moved).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import httpx

RUNNING = "slicegate_estimator_reprofiling"
DONE = "slicegate_estimator_reprofiles_total"
QUIET_POLL_S = 0.5
QUIET_TIMEOUT_S = 600.0


@dataclass(frozen=True, slots=True)
class Profiling:
    """What ``/metrics`` says of background profiles."""

    running: bool
    done: float  # background profiles finished so far, every target together


def parse(text: str) -> Profiling:
    running, done = False, 0.0
    for line in text.splitlines():
        if line.startswith(RUNNING + " "):
            running = float(line.split()[-1]) > 0
        elif line.startswith(DONE):
            done += float(line.split()[-1])
    return Profiling(running, done)


def wait_quiet(url: str, timeout_s: float = QUIET_TIMEOUT_S) -> float:
    """`until_quiet` from synchronous code, on a client of its own; -> seconds waited.

    NOTE: a background profile's ops share the cores with `direct`'s process and the
    server's own ops, so a round timed beside one measures the re-profile, not the path."""
    async def wait() -> float:
        t0 = time.monotonic()
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            await until_quiet(client, timeout_s)
        return time.monotonic() - t0

    return asyncio.run(wait())


async def profiling(client: httpx.AsyncClient) -> Profiling:
    return parse((await client.get("/metrics")).text)


async def until_quiet(client: httpx.AsyncClient, timeout_s: float = QUIET_TIMEOUT_S
                      ) -> Profiling:
    """What ``/metrics`` says once no background profile runs (or at the timeout)."""
    t0 = time.monotonic()
    while (state := await profiling(client)).running and time.monotonic() - t0 < timeout_s:
        await asyncio.sleep(QUIET_POLL_S)
    return state
