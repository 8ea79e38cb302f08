"""A job: one admitted HTTP generation request, its choices, quota lease and bookkeeping."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from executors.types import Priority
from gateway.adapters import AdapterLease
from gateway.errors import ApiError
from gateway.generation import Generation
from gateway.metrics import GatewayMetrics
from gateway.quotas import Lease, retry_after
from gateway.recent import FinishedRequest
from gateway.responses import ResponseFormat, usage
from gateway.tenancy.ledger import BudgetHold
from gateway.tenants import Tenant
from scheduler.api import Overloaded, RequestTooLarge, SubmitError

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Job:
    """One HTTP request's generations; `finish` settles quotas and records metrics once."""

    format: ResponseFormat
    tenant: Tenant
    priority: Priority
    generations: list[Generation]
    lease: Lease
    metrics: GatewayMetrics
    arrival_time: float  # monotonic s
    headers: dict[str, str] = field(default_factory=dict)  # sent with the response
    finished: bool = False
    n: int = 1  # choices per prompt: generations[p * n + j] is prompt p's choice j
    origin: str = "http"  # or "batch": a Batch API line
    # with tracing on: records the finished job's span (gateway/tracing/), given its end
    # (monotonic s); `trace_headers` are the request's W3C trace context headers
    tracer: Callable[[Job, float], None] | None = None
    trace_headers: dict[str, str] = field(default_factory=dict)
    budget: BudgetHold | None = None  # its reservation in the tenant's token budget
    adapter: AdapterLease | None = None  # its hold on its LoRA adapter, released at the end

    def submit(self, prompt_param: str) -> None:
        """Submit every choice; on a refusal abort those already submitted and raise an ApiError."""
        self.metrics.recent.started((g.request.request_id for g in self.generations),
                                    self.tenant.name)
        try:
            for generation in self.generations:
                if not generation.follows:  # NOTE: those its leader submits after its prefill
                    generation.submit()
        except Exception as exc:
            for generation in self.generations:
                generation.close()
            self.finish()
            if not isinstance(exc, SubmitError):
                raise
            self.metrics.rejected.labels(self.tenant.name, type(exc).__name__).inc()
            self.count_shed(exc)
            raise submit_error(exc, prompt_param) from None

    def refused(self, exc: SubmitError, prompt_param: str) -> ApiError:
        """A scheduler refusal that came with the first event (e.g. evicted from its queue):
        counted, and its HTTP answer."""
        self.count_shed(exc)
        return submit_error(exc, prompt_param)

    def count_shed(self, exc: SubmitError) -> None:
        if isinstance(exc, Overloaded):
            self.metrics.shed.labels(self.tenant.name, self.priority.label, exc.reason).inc()

    def usage(self) -> dict[str, Any]:
        """OpenAI's: each prompt counted once (its cached tokens those of its first choice,
        which prefilled it), every choice's completion tokens."""
        firsts = self.generations[::self.n]
        return usage(sum(g.num_prompt_tokens for g in firsts),
                     sum(g.num_generated for g in self.generations),
                     sum(g.num_cached_tokens for g in firsts))

    def finish(self) -> None:
        """Release the quota lease and record the request's metrics. Idempotent."""
        if self.finished:
            return
        self.finished = True
        used = self.usage()
        self.lease.release(used["total_tokens"])
        if self.budget is not None:
            self.budget.settle(used["prompt_tokens"], used["completion_tokens"])
        if self.adapter is not None:
            self.adapter.release()
        now = time.monotonic()
        labels = self.metrics.labels(self.tenant.name, self.priority.label, self.format.model)
        for generation in self.generations:
            if generation.submit_time is not None:
                self._observe(generation, labels, now)
        if self.tracer is not None:
            try:
                self.tracer(self, now)
            except Exception:  # NOTE: a span that cannot be built never fails its request
                logger.exception("recording the trace span of %s failed", self.format.id)

    def _observe(self, g: Generation, labels: tuple[str, str, str], now: float) -> None:
        m = self.metrics
        assert g.submit_time is not None
        m.queue.labels(*labels).observe(g.submit_time - self.arrival_time)
        m.prompt_tokens.labels(*labels).inc(g.num_prompt_tokens)
        m.observe_prefix_cache(labels, g.num_prompt_tokens, g.num_cached_tokens)
        m.generation_tokens.labels(*labels).inc(g.num_generated)
        m.success.labels(*labels, g.finish_reason or "abort").inc()
        ttft = (None if g.first_token_time is None
                else max(g.first_token_time - self.arrival_time, 0.0))
        m.recent.finished(FinishedRequest(g.request.request_id, self.tenant.name,
                                          self.priority.label, now, ttft, g.request.ttft_slo_s))
        if g.first_token_time is None or ttft is None:
            return
        m.ttft.labels(*labels).observe(ttft)
        m.e2e.labels(*labels).observe(now - self.arrival_time)
        if g.num_generated > 1 and g.last_token_time is not None:
            tpot = (g.last_token_time - g.first_token_time) / (g.num_generated - 1)
            m.observe_tpot(labels, tpot, g.request.tpot_slo_s)


def submit_error(exc: SubmitError, prompt_param: str) -> ApiError:
    """The HTTP answer to a scheduler refusal."""
    if isinstance(exc, RequestTooLarge):
        return ApiError(400, f"The request is too large for this server: {exc}",
                        param=prompt_param, code="request_too_large")
    if isinstance(exc, Overloaded):
        seconds = max(1, math.ceil(exc.retry_after_s))
        return ApiError(503, f"The server is overloaded: {exc}. Please retry later.",
                        code="overloaded", headers=retry_after(seconds))
    return ApiError(503, f"The scheduler refused the request: {exc}", code="unavailable")
