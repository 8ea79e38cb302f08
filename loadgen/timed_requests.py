"""The overhead probe's timed requests, over one lean keep-alive connection.

``time_completion`` sends one ``/v1/completions`` request (JSON or SSE) through a
``LeanConnection`` and returns when it was sent, when its first token came
(streaming) and when it ended, on ``time.monotonic()``; an SSE stream fills a
``RequestRecord`` exactly as ``stream_completion`` does (``client.read_sse``).
``time_health`` times ``GET /health`` round trips through httpx and through the
lean connection, alternately: what httpx's own Python adds to a round trip.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx

from loadgen.client import CompletionCall, RequestRecord, read_sse
from loadgen.leanhttp import LeanConnection, LeanHTTPError

REQUEST_TIMEOUT_S = 300.0
_PATH = "/v1/completions"


@dataclass(frozen=True, slots=True)
class Timing:
    """One request's times, seconds on ``time.monotonic()``."""

    send_s: float
    first_s: float | None  # the first token (streaming only)
    end_s: float


@dataclass(slots=True)
class RoundTrips:
    """``GET /health`` round trips, seconds each, through httpx and the lean connection."""

    httpx_s: list[float] = field(default_factory=list)
    lean_s: list[float] = field(default_factory=list)

    def extend(self, other: RoundTrips) -> None:
        self.httpx_s += other.httpx_s
        self.lean_s += other.lean_s


def _headers(call: CompletionCall) -> dict[str, str]:
    return {**call.headers(), "Content-Type": "application/json"}


async def _json(lean: LeanConnection, call: CompletionCall) -> Timing:
    body = {k: v for k, v in call.body().items() if k != "stream_options"}
    data = json.dumps({**body, "stream": False}).encode()
    await lean.connect()  # NOTE: a reconnection, when one is due, is not timed
    send = time.monotonic()
    response = await lean.request("POST", _PATH, data, _headers(call))
    text = await response.read()
    end = time.monotonic()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {text[:300].decode('utf-8', 'replace')}")
    return Timing(send, None, end)


async def _stream(lean: LeanConnection, call: CompletionCall) -> Timing:
    record = RequestRecord("probe", 0, 0.0, 0, call.max_tokens)
    data = json.dumps(call.body()).encode()
    await lean.connect()
    record.send_s = time.monotonic()
    response = await lean.request("POST", _PATH, data, _headers(call))
    record.status = response.status
    if response.status != 200:
        text = (await response.read())[:300].decode("utf-8", "replace")
        raise RuntimeError(f"streaming request failed: HTTP {response.status}: {text}")
    await read_sse(response.iter_lines(), record, 0.0)  # origin 0: times are monotonic()
    record.end_s = time.monotonic()
    if not record.ok:
        raise RuntimeError(f"streaming request failed: {record.error}")
    await response.read()  # what follows [DONE], so the connection carries the next request
    return Timing(record.send_s, record.first_token_s, record.end_s)


async def time_completion(lean: LeanConnection, call: CompletionCall, stream: bool) -> Timing:
    """One completion, JSON or SSE; RuntimeError says why it failed (HTTP status, a stream
    without [DONE] or finish_reason, a broken connection, no answer in REQUEST_TIMEOUT_S)."""
    try:
        async with asyncio.timeout(REQUEST_TIMEOUT_S):
            return await (_stream(lean, call) if stream else _json(lean, call))
    except (LeanHTTPError, TimeoutError) as exc:
        kind = "streaming" if stream else "JSON"
        raise RuntimeError(f"{kind} request failed: {exc!r}") from exc


async def _timed(get: Callable[[], Awaitable[int]]) -> float:
    start = time.monotonic()
    status = await get()
    elapsed = time.monotonic() - start
    if status != 200:
        raise RuntimeError(f"GET /health: HTTP {status}")
    return elapsed


async def time_health(client: httpx.AsyncClient, lean: LeanConnection, count: int) -> RoundTrips:
    """``count`` ``GET /health`` round trips each through ``client`` and ``lean``, alternately."""

    async def via_httpx() -> int:
        return (await client.get("/health")).status_code

    async def via_lean() -> int:
        response = await lean.request("GET", "/health")
        await response.read()
        return response.status

    trips = RoundTrips()
    for _ in range(count):
        trips.httpx_s.append(await _timed(via_httpx))
        await lean.connect()
        trips.lean_s.append(await _timed(via_lean))
    return trips
