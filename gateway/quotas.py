"""Per-tenant quotas: concurrent requests, requests per minute and tokens per minute.

Rates are token buckets that refill continuously over a minute. A request is
charged its prompt tokens plus the `max_tokens` it asked for when it starts,
and settled to the tokens it really used when it ends; a bucket may go into
debt, so a request larger than the whole per-minute budget still runs once
the bucket is full and then delays the tenant's next requests.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from gateway.errors import ApiError
from gateway.tenants import Tenant


@dataclass(slots=True)
class TokenBucket:
    """`capacity` units per minute, refilled continuously; `level` may go negative (debt)."""

    capacity: float
    level: float
    updated: float  # monotonic s of the last refill

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.updated) * self.capacity / 60)
        self.updated = now

    def wait_s(self, amount: float) -> float:
        """Seconds until `amount` (at most a full bucket) is available; 0 if it is now."""
        need = min(amount, self.capacity)
        return 0.0 if self.level >= need else (need - self.level) * 60 / self.capacity

    def reset_s(self) -> float:
        """Seconds until the bucket is full again."""
        return max(self.capacity - self.level, 0.0) * 60 / self.capacity


@dataclass(slots=True)
class _TenantUsage:
    in_flight: int = 0
    requests: TokenBucket | None = None
    tokens: TokenBucket | None = None


@dataclass(frozen=True, slots=True)
class QuotaRejection:
    """Why a request may not start now, and when to try again."""

    kind: str  # "concurrency" | "requests" | "tokens"
    message: str
    retry_after_s: float


class Lease:
    """One admitted request's hold on its tenant's quotas; release it exactly once."""

    def __init__(self, usage: _TenantUsage, charged_tokens: int,
                 clock: Callable[[], float]) -> None:
        self._usage = usage
        self._charged = charged_tokens
        self._clock = clock
        self._released = False

    def release(self, used_tokens: int) -> None:
        """End the request: free its concurrency slot, settle tokens to `used_tokens`."""
        if self._released:
            return
        self._released = True
        self._usage.in_flight -= 1
        if self._usage.tokens is not None:
            self._usage.tokens.refill(self._clock())
            self._usage.tokens.level += self._charged - used_tokens


class Quotas:
    """Quota state of every tenant; `check` is pure, `acquire` commits."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._usage: dict[str, _TenantUsage] = {}

    def _state(self, tenant: Tenant) -> _TenantUsage:
        usage = self._usage.get(tenant.name)
        if usage is None:
            usage = self._usage[tenant.name] = _TenantUsage()
        now = self._clock()
        # NOTE: by name, so usage outlives a tenants reload; a changed limit resizes its bucket
        usage.requests = _sized(usage.requests, tenant.requests_per_minute, now)
        usage.tokens = _sized(usage.tokens, tenant.tokens_per_minute, now)
        return usage

    def check(self, tenant: Tenant, tokens: int) -> QuotaRejection | None:
        """Whether a request of `tokens` may start now (None) or why not."""
        usage = self._state(tenant)
        if tenant.max_concurrency is not None and usage.in_flight >= tenant.max_concurrency:
            return QuotaRejection("concurrency", f"Tenant {tenant.name!r} has "
                                  f"{usage.in_flight} requests in flight (limit "
                                  f"{tenant.max_concurrency}).", 1.0)
        if usage.requests is not None and (wait := usage.requests.wait_s(1)) > 0:
            return QuotaRejection("requests", f"Rate limit reached for tenant {tenant.name!r} "
                                  f"on requests per min: limit {tenant.requests_per_minute}.",
                                  wait)
        if usage.tokens is not None and (wait := usage.tokens.wait_s(tokens)) > 0:
            return QuotaRejection("tokens", f"Rate limit reached for tenant {tenant.name!r} on "
                                  f"tokens per min: limit {tenant.tokens_per_minute}, "
                                  f"requested {tokens}.", wait)
        return None

    def acquire(self, tenant: Tenant, tokens: int) -> Lease:
        """Charge a request of `tokens`; raises a 429 ApiError when a quota is exhausted."""
        rejection = self.check(tenant, tokens)
        if rejection is not None:
            headers = {**self.headers(tenant), **retry_after(rejection.retry_after_s)}
            raise ApiError(429, rejection.message + " Please try again later.",
                           type=rejection.kind, code="rate_limit_exceeded", headers=headers)
        usage = self._state(tenant)
        usage.in_flight += 1
        if usage.requests is not None:
            usage.requests.level -= 1
        if usage.tokens is not None:
            usage.tokens.level -= tokens
        return Lease(usage, tokens, self._clock)

    def headers(self, tenant: Tenant) -> dict[str, str]:
        """OpenAI-style `x-ratelimit-*` headers for the tenant's rate limits."""
        usage = self._state(tenant)
        out: dict[str, str] = {}
        for kind, bucket in (("requests", usage.requests), ("tokens", usage.tokens)):
            if bucket is not None:
                out[f"x-ratelimit-limit-{kind}"] = str(int(bucket.capacity))
                out[f"x-ratelimit-remaining-{kind}"] = str(max(int(bucket.level), 0))
                out[f"x-ratelimit-reset-{kind}"] = format_duration(bucket.reset_s())
        return out

    def in_flight(self, tenant: Tenant) -> int:
        return self._state(tenant).in_flight


def _sized(bucket: TokenBucket | None, per_minute: int | None,
           now: float) -> TokenBucket | None:
    """`bucket` refilled to now with capacity `per_minute` (a new full one if it had none)."""
    if not per_minute:
        return None
    if bucket is None:
        return TokenBucket(float(per_minute), float(per_minute), now)
    bucket.refill(now)
    if bucket.capacity != per_minute:
        bucket.capacity = float(per_minute)
        bucket.level = min(bucket.level, bucket.capacity)
    return bucket


def retry_after(seconds: float) -> dict[str, str]:
    """`Retry-After` (whole seconds, >= 1) and `retry-after-ms` headers."""
    return {"retry-after": str(max(1, math.ceil(seconds))),
            "retry-after-ms": str(max(1, math.ceil(seconds * 1000)))}


def format_duration(seconds: float) -> str:
    """OpenAI's reset format: `20ms`, `1.5s`, `6m0s`."""
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    if seconds < 60:
        return f"{seconds:.3g}s"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}m{rest:.0f}s"
