"""What loadgen asks a server besides completions: its models, tenant SLOs and op timeline."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from dataclasses import replace

import httpx

from loadgen.timeline import OpSpan, parse_timeline

SLO_METRIC = "slicegate_tenant_ttft_slo_seconds"
_FAR_FUTURE_S = 1e12  # a `since` that selects no op: the first poll only reads the clock
_LABEL_RE = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def auth(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def first_model(client: httpx.AsyncClient, api_key: str = "") -> str:
    """The id of the first model of ``GET /v1/models``; RuntimeError says why there is none."""
    url = client.base_url.join("/v1/models")
    try:
        response = await client.get("/v1/models", headers=auth(api_key))
        if response.status_code != 200:
            raise RuntimeError(f"cannot read the model from {url}: HTTP {response.status_code}; "
                               "pass --model")
        return str(response.json()["data"][0]["id"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise RuntimeError(f"cannot read the model from {url} ({exc!s}); pass --model") from exc


def parse_tenant_slos(metrics_text: str) -> dict[str, float]:
    """Tenant -> TTFT SLO seconds, from ``slicegate_tenant_ttft_slo_seconds{tenant=...}`` lines."""
    slos: dict[str, float] = {}
    for line in metrics_text.splitlines():
        if not line.startswith(SLO_METRIC + "{"):
            continue
        labels, _, value = line[len(SLO_METRIC):].rpartition("}")
        tenant = dict(_LABEL_RE.findall(labels)).get("tenant")
        try:
            slo = float(value.split()[0])
        except (IndexError, ValueError):
            continue
        if tenant is not None and slo > 0:
            slos[tenant] = slo
    return slos


async def tenant_slos(client: httpx.AsyncClient) -> dict[str, float]:
    """The tenants' TTFT SLOs a slicegate server exports on ``/metrics`` ({} elsewhere)."""
    try:
        response = await client.get("/metrics")
    except httpx.HTTPError:
        return {}
    return parse_tenant_slos(response.text) if response.status_code == 200 else {}


class TimelinePoller:
    """Collects ``/admin/timeline`` while a replay runs, so a small server ring buffer suffices.

    slicegate answers ``{"now", "since", "events"}``; ``now`` (the server's
    ``time.monotonic()``) gives the offset between its clock and ours, so the
    spans are kept on our clock even when the server runs on another host.
    Without ``now``, or with ``same_clock`` (a server this process started on its own
    host: both read one ``CLOCK_MONOTONIC``), the clocks are taken to be the same.

    NOTE: an offset estimated on one host is off by up to half a round trip, since the
    server stamps ``now`` after booking its pending ops: ~0.5 ms of a request's time
    before its first op read as after its last, in the overhead probe.
    """

    def __init__(self, client: httpx.AsyncClient, admin_key: str, since_s: float,
                 interval_s: float = 1.0, same_clock: bool = False) -> None:
        self._same_clock = same_clock
        self._client = client
        self._admin_key = admin_key
        self._since_s = since_s  # our clock
        self._interval_s = interval_s
        self._offset_s = 0.0  # server clock - our clock
        self._best_rtt_s = float("inf")
        self.spans: set[OpSpan] = set()  # on our clock
        self.error: str | None = None  # why no timeline came back, if none did

    async def poll_once(self, since_s: float | None = None) -> bool:
        """Fetch ops that ended at or after the last one seen; False once the server refused."""
        since = (self._since_s if since_s is None else since_s) + self._offset_s
        sent = time.monotonic()
        try:
            response = await self._client.get(
                "/admin/timeline", params={"since": repr(since)}, headers=auth(self._admin_key))
            received = time.monotonic()
            if response.status_code != 200:
                self.error = f"/admin/timeline answered HTTP {response.status_code}"
                return False
            payload = response.json()
            self._update_offset(payload, sent, received)
            spans = [_shift(s, -self._offset_s) for s in parse_timeline(payload)]
        except (httpx.HTTPError, ValueError) as exc:
            self.error = f"/admin/timeline: {exc!s}"[:300]
            return False
        self.error = None
        self.spans.update(spans)
        if spans:
            self._since_s = max(self._since_s, max(s.end_s for s in spans))
        return True

    def _update_offset(self, payload: object, sent: float, received: float) -> None:
        now = payload.get("now") if isinstance(payload, dict) else None
        if self._same_clock or not isinstance(now, int | float):
            return
        if received - sent < self._best_rtt_s:
            # NOTE: the reading with the shortest round trip bounds the offset best.
            self._best_rtt_s = received - sent
            self._offset_s = float(now) - (sent + received) / 2

    async def run(self, stop: asyncio.Event) -> None:
        """Learn the clock offset, then poll every ``interval_s`` until ``stop``, then once more."""
        if not await self.poll_once(since_s=_FAR_FUTURE_S):
            return
        while not stop.is_set():
            if not await self.poll_once():
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._interval_s)
        await self.poll_once()


def _shift(span: OpSpan, by_s: float) -> OpSpan:
    return replace(span, start_s=span.start_s + by_s, end_s=span.end_s + by_s)
