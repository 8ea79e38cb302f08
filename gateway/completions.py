"""Serving one generation request: priority, limits, quotas, submit, then stream or collect.

The route has authenticated the tenant, validated the body and tokenized the
prompts; `generate` does the rest. Non-streaming requests race their
collection against client disconnect, like streams do, so a client that
gives up aborts its request.
"""

from __future__ import annotations

import time
from typing import Any, TypeVar

from fastapi import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from executors.types import Priority
from gateway.disconnect import unless_disconnected
from gateway.engine import Engine
from gateway.errors import ApiError, arrival_of, request_id_of
from gateway.generation import Generation, merge
from gateway.job import Job
from gateway.prompts import resolve_max_tokens
from gateway.protocol import GenerationOptions
from gateway.responses import OrjsonResponse, ResponseFormat
from gateway.state import AppState, state_of
from gateway.streaming import EventStreamResponse, first_delta, sse_body
from gateway.tenants import Tenant, effective_priority
from models.sampling_params import SamplingParams
from scheduler.api import NO_DEVICE, SubmitError
from scheduler.api import Request as SchedulerRequest

_T = TypeVar("_T")
CLIENT_CLOSED_REQUEST = 499  # nginx's status for "the client went away"; never seen by it


def _sampling(options: GenerationOptions, max_tokens: int, engine: Engine) -> SamplingParams:
    """The request's own values, else the served model's defaults, else OpenAI's."""
    defaults = engine.sampling_defaults
    stops = (() if options.ignore_eos else engine.eos_token_ids) + options.stop_token_ids
    return SamplingParams(temperature=_first(options.temperature, defaults.temperature, 1.0),
                          top_p=_first(options.top_p, defaults.top_p, 1.0),
                          top_k=_first(options.top_k, defaults.top_k, 0),
                          seed=options.seed, max_tokens=max_tokens,
                          min_tokens=options.min_tokens,
                          stop_token_ids=tuple(dict.fromkeys(stops)))


def _first(given: _T | None, default: _T | None, fallback: _T) -> _T:
    if given is not None:
        return given
    return default if default is not None else fallback


def _charged_tokens(options: GenerationOptions, prompts: list[list[int]],
                    max_tokens: list[int], chat: bool) -> int:
    # NOTE: chat without max_tokens is charged its prompt only, as OpenAI estimates it;
    # settling at the end charges what was really generated.
    prompt_tokens = sum(len(p) for p in prompts)
    if chat and options.max_tokens is None:
        return prompt_tokens
    return prompt_tokens + sum(max_tokens)


def build_job(state: AppState, tenant: Tenant, priority: Priority, options: GenerationOptions,
              prompts: list[list[int]], chat: bool, *, request_id: str, arrival: float,
              ttft_slo_s: float | None) -> Job:
    """An admitted, not yet submitted Job: limits resolved, quota charged (429 ApiError)."""
    engine, config = state.engine, state.config
    max_tokens = [resolve_max_tokens(options, len(p), engine.max_model_len, chat,
                                     engine.sampling_defaults.max_tokens) for p in prompts]
    fmt = ResponseFormat(chat, f"{'chatcmpl' if chat else 'cmpl'}-{request_id}",
                         int(time.time()), engine.served_model_name, options.include_usage)
    generations = [
        Generation(i, SchedulerRequest(
            request_id=f"{fmt.id}-{i}", tenant=tenant.name, priority=priority,
            prompt_token_ids=ids, sampling=_sampling(options, max_tokens[i], engine),
            ttft_slo_s=ttft_slo_s, arrival_time=arrival,
            deadline_s=config.server.request_timeout_s, cache_salt=tenant.cache_salt),
            engine, options.stop)
        for i, ids in enumerate(prompts)]
    lease = state.quotas.acquire(tenant, _charged_tokens(options, prompts, max_tokens, chat))
    headers = {"x-slicegate-priority": priority.label, **state.quotas.headers(tenant)}
    return Job(fmt, tenant, priority, generations, lease, state.metrics, arrival, headers)


async def generate(request: Request, tenant: Tenant, options: GenerationOptions,
                   prompts: list[list[int]], chat: bool) -> Response:
    """Admit and run a validated generation request; the HTTP response."""
    state = state_of(request)
    priority = effective_priority(tenant.priority, request.headers.get("x-priority"),
                                  options.priority, options.service_tier)
    try:
        job = build_job(state, tenant, priority, options, prompts, chat,
                        request_id=request_id_of(request), arrival=arrival_of(request),
                        ttft_slo_s=tenant.ttft_slo_s)
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


async def collect(job: Job, prompt_param: str) -> dict[str, Any]:
    """The non-streaming response body of a submitted job (a failed generation: 500 ApiError)."""
    n = len(job.generations)
    texts: list[str] = [""] * n
    finishes: list[str | None] = [None] * n
    deltas = merge(job.generations)
    try:
        async for delta in deltas:
            texts[delta.index] += delta.text
            if delta.finish_reason == "error":
                # NOTE: ended because no device is left: 503, the server may recover
                gone = (delta.error or "").startswith(NO_DEVICE)
                raise ApiError(503 if gone else 500, f"Generation failed: {delta.error} "
                               f"(request id {job.format.id}).",
                               code="unavailable" if gone else "generation_error")
            if delta.finish_reason is not None:
                finishes[delta.index] = delta.finish_reason
    except SubmitError as exc:  # a scheduler that refuses lazily, at the first event
        raise job.refused(exc, prompt_param) from None
    finally:
        await deltas.aclose()
    return job.format.response(texts, finishes, job.usage())


async def _collect_unless_disconnected(job: Job, receive: Receive,
                                       prompt_param: str) -> dict[str, Any] | None:
    """The response body, or None when the client went away first (the job is aborted)."""
    try:
        _, result = await unless_disconnected(collect(job, prompt_param), receive)
        return result
    finally:
        for generation in job.generations:
            generation.close()
