"""A finished job as plain span data: the request span, its attributes and plan children.

Nothing here imports OpenTelemetry: `request_span` is a pure function of a `Job`, so what
a span says is tested without an exporter, and `gateway.tracing.otel` only converts a
`SpanSpec` into SDK spans. Attribute names are vLLM's (`vllm/tracing.py` `SpanAttributes`,
after OpenTelemetry's GenAI conventions) where one exists; slicegate's own start with
`slicegate.`. Times are monotonic seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.generation import Generation
from gateway.job import Job

# vLLM's names (vllm/tracing.py)
REQUEST_ID = "gen_ai.request.id"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
OPERATION = "gen_ai.operation.name"
MAX_TOKENS = "gen_ai.request.max_tokens"
TEMPERATURE = "gen_ai.request.temperature"
TOP_P = "gen_ai.request.top_p"
N = "gen_ai.request.n"
PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"
CACHED_TOKENS = "gen_ai.usage.cached_tokens"
NUM_SEQUENCES = "gen_ai.usage.num_sequences"
FINISH_REASONS = "gen_ai.response.finish_reasons"
TIME_IN_QUEUE = "gen_ai.latency.time_in_queue"
TTFT = "gen_ai.latency.time_to_first_token"
E2E = "gen_ai.latency.e2e"
TIME_IN_PREFILL = "gen_ai.latency.time_in_model_prefill"
TIME_IN_DECODE = "gen_ai.latency.time_in_model_decode"
# slicegate's own
TENANT = "slicegate.tenant"
PRIORITY = "slicegate.priority"
ORIGIN = "slicegate.origin"
PREEMPTIONS = "slicegate.num_preemptions"
TTFT_SLO = "slicegate.ttft_slo_s"
DEVICES = "slicegate.plan.devices"
CHOICE = "slicegate.choice"
NUM_PLANS = "slicegate.plan.count"
PLAN_TOKENS = "slicegate.plan.num_tokens"
BATCH_SIZE = "slicegate.plan.max_batch_size"


@dataclass(frozen=True, slots=True)
class EventSpec:
    """A point in a span's life (monotonic s)."""

    name: str
    time: float
    attributes: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SpanSpec:
    """One span to export: its times (monotonic s), attributes, events and child spans."""

    name: str
    start: float
    end: float
    attributes: dict[str, Any]
    events: tuple[EventSpec, ...] = ()
    children: tuple[SpanSpec, ...] = ()
    error: str | None = None  # the span's status is ERROR with this description


def request_span(job: Job, end: float) -> SpanSpec:
    """The span of `job`, which ended at `end`: one per HTTP request (or Batch API line),
    with one child span per plan run of each choice (see `scheduler.api.PlanRun`)."""
    gens = job.generations
    first = gens[0]
    sampling = first.request.sampling
    used = job.usage()
    attributes: dict[str, Any] = {
        OPERATION: "chat" if job.format.chat else "text_completion",
        REQUEST_ID: job.format.id, REQUEST_MODEL: job.format.model,
        RESPONSE_MODEL: job.format.model, TENANT: job.tenant.name,
        PRIORITY: job.priority.label, ORIGIN: job.origin,
        MAX_TOKENS: sampling.max_tokens, TEMPERATURE: sampling.temperature,
        TOP_P: sampling.top_p, N: job.n, NUM_SEQUENCES: len(gens),
        PROMPT_TOKENS: used["prompt_tokens"], COMPLETION_TOKENS: used["completion_tokens"],
        CACHED_TOKENS: used["prompt_tokens_details"]["cached_tokens"],
        FINISH_REASONS: [g.finish_reason or "abort" for g in gens],
        PREEMPTIONS: sum(g.trace.num_preemptions for g in gens if g.trace is not None),
        E2E: end - job.arrival_time,
    }
    if first.request.ttft_slo_s is not None:
        attributes[TTFT_SLO] = first.request.ttft_slo_s
    attributes.update(_latencies(job, first))
    return SpanSpec(f"{attributes[OPERATION]} {job.format.model}", job.arrival_time, end,
                    attributes, _events(gens), _plan_spans(gens), _error(gens))


def _latencies(job: Job, first: Generation) -> dict[str, float]:
    """Queue (submit to first plan), TTFT (arrival to the first token of any choice),
    prefill (first plan to first token) and decode (first to last token) of the first choice."""
    out: dict[str, float] = {}
    firsts = [g.first_token_time for g in job.generations if g.first_token_time is not None]
    if firsts:
        out[TTFT] = max(min(firsts) - job.arrival_time, 0.0)
    scheduled = first.trace.scheduled_time if first.trace is not None else None
    if scheduled is not None and first.submit_time is not None:
        out[TIME_IN_QUEUE] = max(scheduled - first.submit_time, 0.0)
        if first.first_token_time is not None:
            out[TIME_IN_PREFILL] = max(first.first_token_time - scheduled, 0.0)
    if first.first_token_time is not None and first.last_token_time is not None:
        out[TIME_IN_DECODE] = first.last_token_time - first.first_token_time
    return out


def _events(gens: list[Generation]) -> tuple[EventSpec, ...]:
    events = []
    for g in gens:
        if g.trace is not None and g.trace.scheduled_time is not None:
            events.append(EventSpec("scheduled", g.trace.scheduled_time, {CHOICE: g.index}))
        if g.first_token_time is not None:
            events.append(EventSpec("first_token", g.first_token_time, {CHOICE: g.index}))
    return tuple(sorted(events, key=lambda e: e.time))


def _plan_spans(gens: list[Generation]) -> tuple[SpanSpec, ...]:
    return tuple(SpanSpec(run.kind, run.start, run.end,
                          {CHOICE: g.index, DEVICES: list(run.devices), NUM_PLANS: run.num_plans,
                           PLAN_TOKENS: run.num_tokens, BATCH_SIZE: run.max_batch_size})
                 for g in gens if g.trace is not None for run in g.trace.runs)


def _error(gens: list[Generation]) -> str | None:
    if any(g.finish_reason == "error" for g in gens):
        return "generation failed"
    if all(g.submit_time is None for g in gens):
        return "not admitted"
    return None
