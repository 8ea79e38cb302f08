"""What chaos reads from a running slicegate server, over HTTP only: RSS, KV, health, sheds."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field

import httpx

from loadgen.probe import auth

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfNa]+)\s*$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def metric_samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """The samples of metric `name` in Prometheus exposition text, with their labels."""
    out = []
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and m.group(1) == name:
            out.append((dict(_LABEL.findall(m.group(2) or "")), float(m.group(3))))
    return out


async def rss_bytes(client: httpx.AsyncClient) -> int | None:
    """The server's resident memory (`process_resident_memory_bytes` on /metrics)."""
    samples = metric_samples((await client.get("/metrics")).text,
                             "process_resident_memory_bytes")
    return int(samples[0][1]) if samples else None


async def kv_blocks_in_use(client: httpx.AsyncClient, admin_key: str) -> int:
    """KV blocks held on every device (`/admin/gmg`)."""
    gmg = (await client.get("/admin/gmg", headers=auth(admin_key))).json()
    return sum(int(d.get("kv_blocks_used", 0)) for d in gmg["devices"])


async def healthy(client: httpx.AsyncClient) -> bool:
    try:
        return (await client.get("/health", timeout=10)).status_code == 200
    except httpx.HTTPError:
        return False


async def shed_counts(client: httpx.AsyncClient) -> dict[str, float]:
    """`slicegate_shed_total` summed by reason."""
    out: dict[str, float] = {}
    for labels, value in metric_samples((await client.get("/metrics")).text,
                                        "slicegate_shed_total"):
        reason = labels.get("reason", "?")
        out[reason] = out.get(reason, 0.0) + value
    return out


async def server_slo_attainment(client: httpx.AsyncClient) -> dict[str, float]:
    """`slicegate_slo_attainment` per class: TTFT from HTTP arrival, measured by the server."""
    return slo_by_class(metric_samples((await client.get("/metrics")).text,
                                       "slicegate_slo_attainment"))


def slo_by_class(samples: list[tuple[dict[str, str], float]]) -> dict[str, float]:
    """Attainment per class (`high`); with several models, per model and class (`NAME/high`)
    so that no model's series hides another's."""
    models = {labels.get("model_name", "") for labels, _ in samples}
    return {(labels.get("priority", "?") if len(models) < 2 else
             f"{labels.get('model_name', '')}/{labels.get('priority', '?')}"): value
            for labels, value in samples}


async def jain(client: httpx.AsyncClient) -> dict[str, float]:
    """`slicegate_fairness_jain` per class."""
    return {labels.get("priority", "?"): value for labels, value in
            metric_samples((await client.get("/metrics")).text, "slicegate_fairness_jain")}


@dataclass(slots=True)
class HealthWatch:
    """Polls /health every `interval_s` while a scenario runs; counts the failed polls."""

    client: httpx.AsyncClient
    interval_s: float = 1.0
    polls: int = 0
    failed: int = 0
    _task: asyncio.Task[None] | None = field(default=None, repr=False)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            ok = await healthy(self.client)
            self.polls += 1
            self.failed += not ok
            await asyncio.sleep(self.interval_s)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
