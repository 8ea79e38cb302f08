"""Quotas: concurrency, requests/min and tokens/min, and the 429 answer with its headers."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from gateway.errors import ApiError
from gateway.quotas import Quotas, format_duration
from gateway.tenants import Tenant, parse_tenants
from tests.gateway.harness import EngineFactory, make_config, running

pytestmark = pytest.mark.asyncio(loop_scope="session")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_requests_per_minute_refills() -> None:
    clock = Clock()
    quotas = Quotas(clock)
    tenant = Tenant("t", ("k",), requests_per_minute=2)
    quotas.acquire(tenant, 0).release(0)
    quotas.acquire(tenant, 0).release(0)
    rejection = quotas.check(tenant, 0)
    assert rejection is not None and rejection.kind == "requests"
    assert rejection.retry_after_s == pytest.approx(30.0)
    clock.now += 30
    assert quotas.check(tenant, 0) is None


async def test_usage_outlives_a_change_of_limits() -> None:
    clock = Clock()
    quotas = Quotas(clock)
    tenant = Tenant("t", requests_per_minute=4, max_concurrency=3)
    lease = quotas.acquire(tenant, 0)
    quotas.acquire(tenant, 0)
    quotas.acquire(tenant, 0).release(0)
    changed = Tenant("t", requests_per_minute=2, max_concurrency=2)  # reloaded: same name
    rejection = quotas.check(changed, 0)  # 2 in flight: at the new limit
    assert rejection is not None and rejection.kind == "concurrency"
    lease.release(0)
    quotas.acquire(changed, 0)  # the last of the 4 requests; the bucket is now 0 of 2
    clock.now += 15  # half a request refilled
    rejection = quotas.check(Tenant("t", requests_per_minute=2, max_concurrency=9), 0)
    assert rejection is not None and rejection.retry_after_s == pytest.approx(15.0)


async def test_tokens_are_settled_to_actual_use() -> None:
    clock = Clock()
    quotas = Quotas(clock)
    tenant = Tenant("t", ("k",), tokens_per_minute=100)
    lease = quotas.acquire(tenant, 90)
    assert quotas.check(tenant, 20) is not None
    lease.release(10)  # only 10 used: 80 come back
    assert quotas.check(tenant, 20) is None
    lease.release(10)  # idempotent
    assert quotas.headers(tenant)["x-ratelimit-remaining-tokens"] == "90"


async def test_big_request_waits_for_a_full_bucket_then_runs() -> None:
    clock = Clock()
    quotas = Quotas(clock)
    tenant = Tenant("t", ("k",), tokens_per_minute=100)
    quotas.acquire(tenant, 500).release(500)  # debt of 400
    rejection = quotas.check(tenant, 500)
    assert rejection is not None and rejection.retry_after_s == pytest.approx(300.0)
    clock.now += 300
    assert quotas.check(tenant, 500) is None


async def test_concurrency() -> None:
    quotas = Quotas()
    tenant = Tenant("t", ("k",), max_concurrency=1)
    lease = quotas.acquire(tenant, 1)
    with pytest.raises(ApiError) as info:
        quotas.acquire(tenant, 1)
    assert info.value.status == 429 and info.value.headers["retry-after"] == "1"
    lease.release(1)
    quotas.acquire(tenant, 1)


async def test_durations() -> None:
    assert format_duration(0.02) == "20ms"
    assert format_duration(1.5) == "1.5s"
    assert format_duration(360) == "6m0s"


TENANTS = """\
tenants:
  - {name: a, api_keys: [ka], requests_per_minute: 2}
  - {name: b, api_keys: [kb], tokens_per_minute: 50}
  - {name: c, api_keys: [kc], max_concurrency: 1}
"""


async def test_429_over_http(make_engine: EngineFactory) -> None:
    config = make_config(parse_tenants(TENANTS))
    async with running(config, make_engine(token_delay_s=0.02)) as h:
        async def post(key: str, **body: object) -> httpx.Response:
            return await h.client.post("/v1/completions",
                                       json={"prompt": "x", "max_tokens": 4, **body},
                                       headers={"authorization": f"Bearer {key}"})

        ok = await post("ka")
        assert ok.headers["x-ratelimit-limit-requests"] == "2"
        assert ok.headers["x-ratelimit-remaining-requests"] == "1"
        await post("ka")
        limited = await post("ka")
        assert limited.status_code == 429
        assert limited.json()["error"]["code"] == "rate_limit_exceeded"
        assert int(limited.headers["retry-after"]) >= 1
        assert limited.headers["x-ratelimit-remaining-requests"] == "0"
        assert "x-ratelimit-reset-requests" in limited.headers

        assert (await post("kb", max_tokens=40)).status_code == 200
        tokens = await post("kb", max_tokens=40)
        assert tokens.status_code == 429 and tokens.json()["error"]["type"] == "tokens"

        first = asyncio.create_task(post("kc", max_tokens=10))
        while not h.fake.num_requests:
            await asyncio.sleep(0.005)
        busy = await post("kc")
        assert busy.status_code == 429 and busy.json()["error"]["type"] == "concurrency"
        assert (await first).status_code == 200
        assert (await post("kc")).status_code == 200
