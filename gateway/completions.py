"""Serving one generation request: priority, limits, quotas, submit, then stream or collect.

The route has authenticated the tenant, validated the body and tokenized the
prompts; `generate` does the rest. Non-streaming requests race their
collection against client disconnect, like streams do, so a client that
gives up aborts its request.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gateway.admission import build_job, collect
from gateway.disconnect import unless_disconnected
from gateway.errors import ApiError, arrival_of, request_id_of
from gateway.job import Job
from gateway.protocol import GenerationOptions
from gateway.responses import OrjsonResponse
from gateway.state import state_of
from gateway.streaming import EventStreamResponse, first_delta, sse_body
from gateway.tenants import Tenant, effective_priority
from gateway.tools.types import ToolRequest
from gateway.tracing.setup import incoming_context

CLIENT_CLOSED_REQUEST = 499  # nginx's status for "the client went away"; never seen by it


async def generate(request: Request, tenant: Tenant, options: GenerationOptions,
                   prompts: list[list[int]], chat: bool,
                   tools: ToolRequest | None = None) -> Response:
    """Admit and run a validated generation request; the HTTP response."""
    state = state_of(request)
    priority = effective_priority(tenant.priority, request.headers.get("x-priority"),
                                  options.priority, options.service_tier)
    try:
        job = build_job(state.admission, tenant, priority, options, prompts, chat,
                        request_id=request_id_of(request), arrival=arrival_of(request),
                        ttft_slo_s=tenant.ttft_slo_s, tpot_slo_s=tenant.tpot_slo_s, tools=tools,
                        trace_headers=None if state.tracing is None
                        else incoming_context(request.headers))
    except ApiError as exc:
        if exc.status == 429:
            state.metrics.rejected.labels(tenant.name, exc.type).inc()
            state.metrics.shed.labels(tenant.name, priority.label, f"quota_{exc.type}").inc()
        raise
    prompt_param = "messages" if chat else "prompt"
    job.submit(prompt_param)
    if options.stream:
        started = await first_delta(job, request.receive, prompt_param)
        if started is None:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        return EventStreamResponse(sse_body(job, prompt_param, started), headers=job.headers)
    try:
        result = await _collect_unless_disconnected(job, request.receive, prompt_param)
        if result is None:
            job.finish()
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        return SettlingResponse(result, job)
    except BaseException:
        job.finish()
        raise


class SettlingResponse(OrjsonResponse):
    """A job's JSON response; the job is settled (quota lease, metrics) once it is sent or
    sending failed. NOTE: after, not before: the client reads its answer ~0.1 ms sooner, and
    nothing can read the settled state in between (no turn of the loop follows the send)."""

    def __init__(self, content: dict[str, Any], job: Job) -> None:
        super().__init__(content, headers=job.headers)
        self.job = job

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.finish()


async def _collect_unless_disconnected(job: Job, receive: Receive,
                                       prompt_param: str) -> dict[str, Any] | None:
    """The response body, or None when the client went away first (the job is aborted)."""
    try:
        _, result = await unless_disconnected(collect(job, prompt_param), receive)
        return result
    finally:
        for generation in job.generations:
            generation.close()
