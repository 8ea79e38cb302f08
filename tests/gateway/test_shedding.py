"""Shedding as clients see it: 503 + Retry-After, 429 for quotas, `slicegate_shed_total`."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import pytest

from executors.types import Priority
from gateway.config import ConfigError, SchedulerSettings, parse_queue_bounds
from gateway.engine import scheduler_config
from gateway.metrics import GatewayMetrics
from gateway.tenants import parse_tenants
from scheduler.api import Overloaded, Request, SchedulerStats, TokenEvent
from scheduler.testing.fake import FakeScheduler
from tests.gateway.harness import EngineFactory, make_config, running


class _Evicting(FakeScheduler):
    """Accepts, then evicts the request when its stream is first read."""

    def submit(self, request: Request) -> AsyncIterator[TokenEvent]:
        async def evicted() -> AsyncIterator[TokenEvent]:
            raise Overloaded("evicted for high-priority work", retry_after_s=7.2,
                             reason="evicted")
            yield  # an async generator

        return evicted()


class _Full(FakeScheduler):
    def submit(self, request: Request) -> AsyncIterator[TokenEvent]:
        raise Overloaded("too much low-priority work is waiting", retry_after_s=3.0,
                         reason="server_full")


def _shed_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("slicegate_shed_total{")]


@pytest.mark.parametrize("scheduler,reason,retry", [(_Evicting, "evicted", "8"),
                                                    (_Full, "server_full", "3")])
async def test_shed_requests_get_503_with_retry_after_and_are_counted(
        make_engine: EngineFactory, scheduler: type[FakeScheduler], reason: str,
        retry: str) -> None:
    engine = dataclasses.replace(make_engine(), scheduler=scheduler())
    async with running(make_config(), engine) as h:
        for stream in (False, True):
            response = await h.client.post("/v1/completions",
                                           json={"prompt": "x", "stream": stream})
            if not stream:
                assert response.status_code == 503
                assert response.json()["error"]["code"] == "overloaded"
                assert response.headers["retry-after"] == retry
        metrics = (await h.client.get("/metrics")).text
    lines = _shed_lines(metrics)
    assert any(f'reason="{reason}"' in line and line.endswith(" 2.0") for line in lines), lines


async def test_a_tenant_quota_is_a_429_counted_as_shed(make_engine: EngineFactory) -> None:
    tenants = parse_tenants("tenants:\n  - name: acme\n    api_keys: [sk-acme]\n"
                            "    priority: low\n    requests_per_minute: 1\n")
    async with running(make_config(tenants), make_engine()) as h:
        auth = {"authorization": "Bearer sk-acme"}
        first = await h.client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2},
                                    headers=auth)
        assert first.status_code == 200
        response = await h.client.post("/v1/completions", json={"prompt": "x"}, headers=auth)
        assert response.status_code == 429 and int(response.headers["retry-after"]) >= 1
        metrics = (await h.client.get("/metrics")).text
    assert any('tenant="acme"' in line and 'class="low"' in line
               and 'reason="quota_requests"' in line for line in _shed_lines(metrics))


def test_queue_bounds_parse_and_reach_the_scheduler() -> None:
    assert parse_queue_bounds(64, "k") == dict.fromkeys(("high", "normal", "low", "total"), 64)
    assert parse_queue_bounds("high=8, low=100,total=90", "k") == {"high": 8, "low": 100,
                                                                   "total": 90}
    for bad in ("urgent=3", "low=x", "low=-1", 2.5):
        with pytest.raises(ConfigError):
            parse_queue_bounds(bad, "k")
    s = SchedulerSettings(devices=("cpu:0",), max_queued_requests="low=10,total=20",
                          max_queued_tokens=5000, max_low_wait_s=30)
    cfg = scheduler_config(s, 1024)
    assert cfg.queue_capacity[Priority.LOW] == 10 and cfg.queue_capacity[Priority.HIGH] == 256
    assert cfg.queue_total_requests == 20 and cfg.queue_total_tokens == 5000
    assert cfg.queue_token_capacity == dict.fromkeys(Priority, 5000)
    assert cfg.max_low_wait_s == 30
    with pytest.raises(ConfigError):
        SchedulerSettings(devices=("cpu:0",), fault_rate=2)


def test_metrics_show_fairness_and_queued_tokens() -> None:
    metrics = GatewayMetrics("m")
    text = metrics.render(SchedulerStats(fairness_jain={"low": 0.75},
                                         queued_tokens={"low": 1200, "high": 0})).decode()
    assert 'slicegate_fairness_jain{priority="low"} 0.75' in text
    assert 'slicegate_queued_prompt_tokens{priority="low"} 1200.0' in text
