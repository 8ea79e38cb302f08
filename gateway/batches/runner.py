"""One batch line through the live endpoints' own path: parse, tokenize, job, submit, collect.

`prepare` ends in a submitted `Job` or, before anything runs, in an answer
(a 4xx for a line the endpoint would refuse) or a `Retry` (a quota or the
scheduler's queue is full: the line stays pending). `finish` collects the
job into the line's result, or a `Retry` when the job was aborted (the
server shutting down): an aborted line is never answered, it runs again.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any

import orjson

from executors.types import Priority
from gateway.admission import build_job, collect
from gateway.batches.context import BatchContext
from gateway.batches.lines import InputLine, parse_body
from gateway.batches.types import LineState, result_line
from gateway.errors import ApiError
from gateway.job import Job
from gateway.prompts import tokenize_chat, tokenize_completion
from gateway.protocol import ChatBody
from gateway.served import resolve_model
from gateway.tenants import Tenant, effective_priority
from gateway.tools.types import offered_tools

_RETRY_STATUSES = (429, 503)  # quota, overloaded, draining: not the line's fault


@dataclass(frozen=True, slots=True)
class Answered:
    """The line's result line and which file it goes to."""

    state: LineState
    result: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Retry:
    """Run the line again, not before `after_s` from now."""

    after_s: float
    reason: str


@dataclass(frozen=True, slots=True)
class Started:
    """A submitted line: its job and the ids its result line will carry."""

    job: Job
    prompt_param: str
    request_id: str


Outcome = Answered | Retry


def _answer(request_id: str, custom_id: str, status: int, body: dict[str, Any]) -> Answered:
    state = LineState.OUTPUT if status == 200 else LineState.ERROR
    return Answered(state, result_line(f"batch_req_{request_id}", custom_id, status, request_id,
                                       body))


def _from_error(exc: ApiError, request_id: str, custom_id: str) -> Outcome:
    if exc.status in _RETRY_STATUSES and exc.code != "insufficient_quota":
        # NOTE: a spent token budget fails the line (as OpenAI's): waiting for the reset
        # could take a day
        after = float(exc.headers.get("retry-after-ms", "1000")) / 1000
        return Retry(after, exc.message)
    return _answer(request_id, custom_id, exc.status, exc.body())


def prepare(context: BatchContext, tenant: Tenant, endpoint: str, custom_id: str,
            body: str) -> Started | Outcome:
    """Validate, tokenize and submit one line at priority `low` (see the module docstring)."""
    request_id = secrets.token_hex(12)
    engine = context.admission.engine
    try:
        parsed = parse_body(InputLine(custom_id, endpoint, orjson.loads(body)), engine,
                            context.max_prompts_per_request)
        # NOTE: each line tokenizes with the tokenizer of the model it names
        engine = engine.of(resolve_model(engine, tenant, parsed.options.model).base)
        chat = isinstance(parsed, ChatBody)
        if isinstance(parsed, ChatBody):
            prompts = [tokenize_chat(engine, parsed.messages, tools=offered_tools(parsed.tools))]
        else:
            prompts = tokenize_completion(engine, parsed.prompts, parsed.suffix)
        options = parsed.options
        # NOTE: a batch line runs in `low` whatever it asks; the tenant's class only lowers it.
        priority = effective_priority(tenant.priority, Priority.LOW.label, options.priority,
                                      options.service_tier)
        job = build_job(context.admission, tenant, priority, options, prompts, chat,
                        request_id=request_id, arrival=time.monotonic(), ttft_slo_s=None,
                        tools=parsed.tools if isinstance(parsed, ChatBody) else None,
                        origin="batch")
        prompt_param = "messages" if chat else "prompt"
        job.submit(prompt_param)
    except ApiError as exc:
        return _from_error(exc, request_id, custom_id)
    return Started(job, prompt_param, request_id)


async def finish(started: Started, custom_id: str) -> Outcome:
    """Collect a submitted line into its answer (closes the job however it ends)."""
    job = started.job
    try:
        body = await collect(job, started.prompt_param)
    except ApiError as exc:
        return _from_error(exc, started.request_id, custom_id)
    finally:
        close_job(job)
    if any(choice["finish_reason"] == "abort" for choice in body["choices"]):
        return Retry(0.0, "the line was aborted")
    return _answer(started.request_id, custom_id, 200, body)


def close_job(job: Job) -> None:
    """Abort whatever of the job still runs and settle its quota. Idempotent."""
    for generation in job.generations:
        generation.close()
    job.finish()
