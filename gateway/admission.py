"""A generation request as a job, with no HTTP in sight: admitted (limits, sampling, quota)
and, once submitted, collected into its response body.

The endpoints (`gateway.completions`) and batch lines (`gateway.batches.runner`) share it;
it takes the app's parts as an `Admission`, so it imports neither the app state nor batches.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from executors.types import Priority
from gateway.adapters import AdapterLease
from gateway.engine import Engine
from gateway.errors import ApiError, invalid
from gateway.generation import Generation, merge
from gateway.job import Job
from gateway.logprobs import Scored, TokenPieces
from gateway.metrics import GatewayMetrics
from gateway.prompts import resolve_max_tokens
from gateway.protocol import GenerationOptions
from gateway.quotas import Quotas
from gateway.responses import ResponseFormat
from gateway.served import Target, resolve_model
from gateway.speculation import resolve as resolve_speculative
from gateway.structured import constraint_for
from gateway.tenancy.ledger import BudgetLedger
from gateway.tenants import Tenant
from gateway.tools.output import tool_output
from gateway.tools.types import ToolRequest
from models.sampling_params import SamplingParams
from scheduler.api import NO_DEVICE, SubmitError
from scheduler.api import Request as SchedulerRequest

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Admission:
    """The app's parts a request is admitted with (`AppState.admission`)."""

    engine: Engine
    quotas: Quotas
    metrics: GatewayMetrics
    request_timeout_s: float  # each generation's deadline, from the request's arrival
    tracer: Callable[[Job, float], None] | None = None  # records finished jobs' spans
    budgets: BudgetLedger = field(default_factory=BudgetLedger)  # tenants' token budgets


def _sampling(options: GenerationOptions, max_tokens: int, engine: Engine) -> SamplingParams:
    """The request's own values, else the served model's defaults, else OpenAI's."""
    defaults = engine.sampling_defaults
    _in_vocabulary("logit_bias", tuple(token for token, _ in options.logit_bias),
                   engine.vocab_size)
    _in_vocabulary("stop_token_ids", options.stop_token_ids, engine.vocab_size)
    stops = (() if options.ignore_eos else engine.eos_token_ids) + options.stop_token_ids
    return SamplingParams(temperature=_first(options.temperature, defaults.temperature, 1.0),
                          top_p=_first(options.top_p, defaults.top_p, 1.0),
                          top_k=_first(options.top_k, defaults.top_k, 0),
                          seed=options.seed, max_tokens=max_tokens,
                          min_tokens=options.min_tokens,
                          stop_token_ids=tuple(dict.fromkeys(stops)),
                          presence_penalty=options.presence_penalty,
                          frequency_penalty=options.frequency_penalty,
                          repetition_penalty=_first(options.repetition_penalty,
                                                    defaults.repetition_penalty, 1.0),
                          logit_bias=options.logit_bias, logprobs=options.logprobs,
                          prompt_logprobs=options.logprobs if options.echo else None)


def _in_vocabulary(param: str, ids: tuple[int, ...], vocab_size: int) -> None:
    """400 naming `param` for a token id out of the model's vocabulary."""
    for token in ids:
        if token >= vocab_size:
            raise invalid(param, f"Invalid token id in '{param}': {token} is out of the "
                                 f"model's vocabulary (size {vocab_size}).", code="invalid_value")


def _first(given: _T | None, default: _T | None, fallback: _T) -> _T:
    if given is not None:
        return given
    return default if default is not None else fallback


def _charged_tokens(options: GenerationOptions, prompts: list[list[int]],
                    max_tokens: list[int], chat: bool) -> int:
    # NOTE: chat without max_tokens is charged its prompt only, as OpenAI estimates it;
    # settling at the end charges what was really generated. Each prompt once, each of its
    # n choices its max_tokens.
    prompt_tokens = sum(len(p) for p in prompts)
    if chat and options.max_tokens is None:
        return prompt_tokens
    return prompt_tokens + options.n * sum(max_tokens)


def build_job(admission: Admission, tenant: Tenant, priority: Priority,
              options: GenerationOptions, prompts: list[list[int]], chat: bool, *,
              request_id: str, arrival: float, ttft_slo_s: float | None,
              tpot_slo_s: float | None = None, tools: ToolRequest | None = None,
              origin: str = "http",
              trace_headers: Mapping[str, str] | None = None) -> Job:
    """An admitted, not yet submitted Job: limits resolved, quota charged, budget reserved
    (429 ApiError).

    With `tools` whose calls are read, the choices' text is parsed for calls by the
    served model's format. With tracing on, the job's span continues `trace_headers`
    (W3C `traceparent`, `tracestate`) and its scheduler requests record their plans.
    Its `model` picks the base or a LoRA adapter (404 / 403), which the job holds until
    it finishes, so that an unloaded adapter stays until its last request ends."""
    target = resolve_model(admission.engine, tenant, options.model)
    adapter = admission.engine.adapters.acquire(target.adapter)
    try:
        return _admit(admission, tenant, priority, options, prompts, chat, target,
                      request_id=request_id, arrival=arrival, ttft_slo_s=ttft_slo_s,
                      tpot_slo_s=tpot_slo_s, tools=tools, origin=origin,
                      trace_headers=trace_headers, adapter=adapter)
    except BaseException:
        adapter.release()
        raise


def _admit(admission: Admission, tenant: Tenant, priority: Priority,
           options: GenerationOptions, prompts: list[list[int]], chat: bool, target: Target,
           *, request_id: str, arrival: float, ttft_slo_s: float | None,
           tpot_slo_s: float | None, tools: ToolRequest | None, origin: str,
           trace_headers: Mapping[str, str] | None, adapter: AdapterLease) -> Job:
    engine, quotas = admission.engine.of(target.base), admission.quotas
    max_tokens = [resolve_max_tokens(options, len(p), engine.max_model_len, chat,
                                     engine.sampling_defaults.max_tokens, engine.context_note)
                  for p in prompts]
    prompt_tokens = sum(len(p) for p in prompts)
    max_tokens = admission.budgets.plan(tenant, prompt_tokens, max_tokens, options.n)
    pieces = None if options.logprobs is None else TokenPieces(engine.tokenizer)
    fmt = ResponseFormat(chat, f"{'chatcmpl' if chat else 'cmpl'}-{request_id}",
                         int(time.time()), target.model, options.include_usage,
                         pieces, tool_output(tools, engine.tool_format))
    generations: list[Generation] = []
    speculative = resolve_speculative(options.speculative, tenant.speculative_config,
                                      engine.speculative)
    for p, ids in enumerate(prompts):
        sampling = _sampling(options, max_tokens[p], engine)
        echo = _echo(engine, ids) if options.echo else None
        leader = None
        for j in range(options.n):
            i = p * options.n + j  # NOTE: prompt-major, as vLLM orders the choices
            generation = Generation(i, SchedulerRequest(
                request_id=f"{fmt.id}-{i}", tenant=tenant.name, priority=priority,
                prompt_token_ids=ids, sampling=_choice_sampling(sampling, j),
                ttft_slo_s=ttft_slo_s, arrival_time=arrival,
                deadline_s=admission.request_timeout_s,
                cache_salt=prefix_cache_salt(tenant, options.cache_salt),
                constraint=None if options.structured is None
                else constraint_for(engine.grammars, options.structured),
                trace=admission.tracer is not None, adapter=target.adapter,
                model=target.base, tpot_slo_s=tpot_slo_s,
                speculative=speculative),
                engine, options.stop, echo, leader)
            generations.append(generation)
            if j == 0 and _share_prefill(options, engine):
                leader = generation
    lease = quotas.acquire(tenant, _charged_tokens(options, prompts, max_tokens, chat))
    hold = admission.budgets.hold(tenant, prompt_tokens, options.n * sum(max_tokens))
    headers = {"x-slicegate-priority": priority.label, **quotas.headers(tenant)}
    return Job(fmt, tenant, priority, generations, lease, admission.metrics, arrival, headers,
               n=options.n, origin=origin, tracer=admission.tracer,
               trace_headers=dict(trace_headers or {}), budget=hold, adapter=adapter)


def prefix_cache_salt(tenant: Tenant, request_salt: str | None) -> str:
    """What keys a request's blocks in the prefix cache: its tenant's salt ("" when the
    tenant shares the pool, else its name), joined with the request's own `cache_salt`."""
    if request_salt is None:
        return tenant.cache_salt
    # NOTE: length-prefixed, so a salt reads back one way only: no `cache_salt` lets a
    # request of one tenant pose as another tenant, or as a request without one
    return f"{len(tenant.cache_salt)}:{tenant.cache_salt}{request_salt}"


def _choice_sampling(sampling: SamplingParams, j: int) -> SamplingParams:
    """Choice j's sampling: with a seed, its own (seed + j), so each choice is reproducible."""
    if j == 0 or sampling.seed is None:
        return sampling
    return replace(sampling, seed=sampling.seed + j)


def _share_prefill(options: GenerationOptions, engine: Engine) -> bool:
    """Whether a prompt's later choices wait for its first one's prefill, to find its blocks
    in the prefix cache. NOTE: not where nothing is cached (prefix caching off, or prompt
    log-probs for echo, which skip the cache): all n go at once."""
    return options.n > 1 and engine.prefix_caching and not options.echo


def _echo(engine: Engine, prompt_ids: list[int]) -> str:
    """The prompt's text as `echo` sends it: its ids decoded (special tokens left out)."""
    return str(engine.tokenizer.decode(prompt_ids, skip_special_tokens=True,
                                       clean_up_tokenization_spaces=False))


async def collect(job: Job, prompt_param: str) -> dict[str, Any]:
    """The non-streaming response body of a submitted job (a failed generation: 500 ApiError)."""
    n = len(job.generations)
    texts: list[str] = [""] * n
    finishes: list[str | None] = [None] * n
    scored: list[list[Scored]] = [[] for _ in range(n)]
    deltas = merge(job.generations)
    try:
        async for delta in deltas:
            texts[delta.index] += delta.text
            scored[delta.index] += delta.logprobs
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
    return job.format.response(texts, finishes, job.usage(), scored)
