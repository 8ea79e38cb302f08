"""The scheduler's interface as the gateway sees it, and the stats it exports."""

from __future__ import annotations

import enum
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from executors.types import Priority
from models.grammar import Constraint
from models.logprobs import TokenLogprobs
from models.sampling_params import SamplingParams
from models.spec_config import SpecConfig

NO_DEVICE = "no device is available"  # starts the error of requests ended by it (HTTP 503)
ROUND_BUCKETS_S = (1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5)


class FinishReason(enum.Enum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class PlanRun:
    """Consecutive plans of one request of one kind on the same devices (times monotonic s).

    A request's decode steps on one placement are one run; a preemption, a migration or a
    chunked prefill's next chunk on other devices starts another."""

    kind: str  # "prefill" (its plans feed prompt tokens) or "decode"
    devices: tuple[str, ...]  # the devices its operators ran on, in chain order
    start: float  # the first plan was issued
    end: float  # the last plan was done (or the request ended)
    num_plans: int
    num_tokens: int  # tokens the request fed in these plans
    max_batch_size: int  # most requests in one of these plans


@dataclass(frozen=True, slots=True)
class RequestTrace:
    """What the scheduler saw of one request, for its trace span (`Request.trace`)."""

    scheduled_time: float | None  # monotonic s its first plan was issued; None = never
    num_preemptions: int
    runs: tuple[PlanRun, ...]


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One generated token, or the end of the stream.

    The last event of a request has `finish_reason` set; an event that ends a
    request without a new token (abort, error) has `token_id` None.
    """

    token_id: int | None
    index: int  # 0-based index among generated tokens
    time: float  # time.monotonic() when the token was sampled
    finish_reason: FinishReason | None = None
    error: str | None = None  # set with FinishReason.ERROR
    num_cached_tokens: int = 0  # prompt tokens its first prefill found in the prefix cache
    # set when the request asks `sampling.logprobs`: this token's (natural log, raw model)
    logprobs: TokenLogprobs | None = None
    # set on the first token's event when it asks `sampling.prompt_logprobs`: one per prompt
    # token, None for the first (nothing predicts it)
    prompt_logprobs: tuple[TokenLogprobs | None, ...] | None = None
    trace: RequestTrace | None = None  # on the last event of a request that asked `trace`


class SubmitError(Exception):
    """Base of the errors `Scheduler.submit` raises before any token is produced."""


class RequestTooLarge(SubmitError):
    """The request can never fit (context length or KV capacity). Maps to HTTP 400."""


class Overloaded(SubmitError):
    """The request was shed: its class's queue or the server is full, or it was evicted for
    a higher class (`reason`, see scheduler/core/admission.py). Maps to HTTP 503 with
    Retry-After."""

    def __init__(self, message: str, retry_after_s: float = 1.0,
                 reason: str = "server_full") -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.reason = reason


@dataclass(slots=True)
class Request:
    """What the gateway submits: one tokenized generation request."""

    request_id: str
    tenant: str
    priority: Priority
    prompt_token_ids: list[int]
    sampling: SamplingParams
    ttft_slo_s: float | None = None  # the tenant's TTFT SLO; None = best effort
    arrival_time: float = field(default_factory=time.monotonic)  # HTTP receipt, monotonic s
    deadline_s: float | None = None  # total wall-clock budget from arrival; None = none
    # NOTE: keys its KV blocks in the prefix cache: requests hit each other's blocks only
    # with equal salts ("" is shared; a tenant that does not share uses its name)
    cache_salt: str = ""
    # structured output: its grammar's matcher, advanced with each token (one per request)
    constraint: Constraint | None = field(default=None, compare=False)
    trace: bool = False  # record its plans: its last event carries a `RequestTrace`
    adapter: str | None = None  # the LoRA adapter it runs with (models/lora.py); None = base
    model: str = ""  # the base model of a server of several (models/modelset.py); "" = the first
    # the tenant's inter-token target once its first token is out; None = no pace kept
    tpot_slo_s: float | None = None
    speculative: SpecConfig | None = None  # prompt-lookup drafting (scheduler/spec/); None = off

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError("prompt_token_ids must not be empty")
        if self.tpot_slo_s is not None and not self.tpot_slo_s > 0:
            raise ValueError(f"tpot_slo_s must be > 0, got {self.tpot_slo_s}")

    @property
    def max_tokens(self) -> int:
        return self.sampling.max_tokens

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def ttft_deadline(self) -> float | None:
        """Monotonic time by which the first token is due, or None."""
        if self.ttft_slo_s is None:
            return None
        return self.arrival_time + self.ttft_slo_s


@dataclass(slots=True)
class Histogram:
    """Cumulative since start: counts per bucket (upper bounds in seconds, then +Inf)."""

    bounds_s: tuple[float, ...] = ROUND_BUCKETS_S
    counts: list[int] = field(default_factory=lambda: [0] * (len(ROUND_BUCKETS_S) + 1))
    sum_s: float = 0.0
    count: int = 0

    def observe(self, seconds: float) -> None:
        i = next((k for k, b in enumerate(self.bounds_s) if seconds <= b), len(self.bounds_s))
        self.counts[i] += 1
        self.sum_s += seconds
        self.count += 1

    def copy(self) -> Histogram:
        return Histogram(self.bounds_s, list(self.counts), self.sum_s, self.count)


@dataclass(frozen=True, slots=True)
class SpecDecodeCounts:
    """vLLM's speculative-decoding counters of one model, cumulative since start."""

    num_drafts: int = 0  # verify steps
    num_draft_tokens: int = 0  # tokens drafted in them
    num_accepted_tokens: int = 0  # drafted tokens accepted
    accepted_per_pos: tuple[int, ...] = ()  # [i]: drafts accepted at position i (0 first)


@dataclass(slots=True)
class SchedulerStats:
    """A point-in-time view for /metrics. Keys of dicts are noted per field."""

    num_running: dict[tuple[str, str], int] = field(default_factory=dict)  # (tenant, class)
    num_waiting: dict[tuple[str, str], int] = field(default_factory=dict)  # (tenant, class)
    # the same two counts per (model, tenant, class): model is the request's LoRA adapter if
    # it has one, else its `Request.model` ("" for a one-model scheduler)
    num_running_by_model: dict[tuple[str, str, str], int] = field(default_factory=dict)
    num_waiting_by_model: dict[tuple[str, str, str], int] = field(default_factory=dict)
    kv_cache_usage: float = 0.0  # used / total KV blocks over all devices, in [0, 1]
    # NOTE: the figures below are per model, keyed by `Request.model` ("" for a one-model
    # server) with every served model present (0 where it ran nothing), so /metrics shows
    # one series per model; a server's figures leave them empty (its fakes)
    # model -> used / total blocks of the KV pools it uses, on the devices it runs on (models
    # of one KV layout share a pool: each reports the shared pool's usage)
    kv_cache_usage_by_model: dict[str, float] = field(default_factory=dict)
    # (model, tenant, class) -> preemptions, cumulative
    num_preemptions: dict[tuple[str, str, str], int] = field(default_factory=dict)
    kv_swapped_bytes: int = 0  # KV copied to host memory by preemptions, cumulative
    kv_recomputed_tokens: int = 0  # tokens of KV dropped by preemptions to recompute
    slo_attainment: dict[str, float] = field(default_factory=dict)  # class -> fraction
    # (model, class) -> fraction of its requests with a TTFT SLO that met it
    slo_attainment_by_model: dict[tuple[str, str], float] = field(default_factory=dict)
    device_busy_ratio: dict[str, float] = field(default_factory=dict)  # device -> fraction
    round_seconds: Histogram = field(default_factory=Histogram)  # decision + apply, per round
    estimator_mape: dict[str, float] = field(default_factory=dict)  # estimator -> fraction
    estimator_cov: dict[str, float] = field(default_factory=dict)  # estimator -> sweep's CoV
    estimator_level: dict[str, float] = field(default_factory=dict)  # estimator -> measured /
    # profiled time (median of recent ops; 1.0 while the machine runs as profiled)
    reprofiles: dict[str, int] = field(default_factory=dict)  # kind or pair -> cumulative
    reprofiling: bool = False  # a background profile is running
    slowdown: dict[tuple[str, str], float] = field(default_factory=dict)  # (op class, class
    # running beside it on another device of the host) -> co-location slowdown
    first_token_factor: dict[str, float] = field(default_factory=dict)  # placement kind ->
    # measured / predicted first-token wait of its recent plans (scheduler/round/calibration.py)
    fairness_jain: dict[str, float] = field(default_factory=dict)  # class -> Jain's index of
    # the tokens each of its tenants was served (scheduler/core/fairness.py)
    queued_tokens: dict[str, int] = field(default_factory=dict)  # class -> prompt tokens waiting
    errors_total: int = 0  # exceptions caught in rounds and completion handlers, cumulative
    healthy: bool = True  # False while rounds keep failing, or once the task or an executor died
    health_detail: str | None = None  # why it is not healthy
    device_up: dict[str, bool] = field(default_factory=dict)  # device -> its executor is up
    device_detail: dict[str, dict[str, Any]] = field(default_factory=dict)  # device -> state,
    # times lost, last error (remote devices)
    # model -> its speculative decoding counters (scheduler/spec/)
    spec_decode: dict[str, SpecDecodeCounts] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DirectTiming:
    """One greedy request's operator chain run directly on a device (`time_direct`)."""

    device: str
    first_token_s: float  # the prefill and the first token's sampling
    total_s: float  # every step, to the last token


class DirectUnavailable(Exception):
    """No device by that name, or it runs no executor thread in this process; or (`param`
    "model") no such model or adapter to run."""

    def __init__(self, message: str, param: str = "device") -> None:
        super().__init__(message)
        self.param = param  # the request field at fault


class SchedulerAPI(Protocol):
    """What `gateway` calls. `scheduler.Scheduler` implements it; `FakeScheduler` too."""

    def submit(self, request: Request) -> AsyncIterator[TokenEvent]:
        """Admit a request (raises RequestTooLarge / Overloaded) and stream its tokens."""
        ...

    def abort(self, request_id: str, reason: str) -> None:
        """End a request early (`stop`, `abort`, ...); frees its KV blocks. Idempotent."""
        ...

    def stats(self) -> SchedulerStats: ...

    def snapshot(self) -> dict[str, Any]:
        """JSON view of the GMG and devices for /admin/gmg."""
        ...

    def timeline(self, since: float) -> list[dict[str, Any]]:
        """Recent op executions (device, op, class, start, end) since monotonic time `since`."""
        ...

    async def time_direct(self, prompt_ids: list[int], max_tokens: int,
                          device: str | None = None, model: str = "",
                          adapter: str | None = None) -> DirectTiming:
        """A request's operator chain with no serving path around it: `max_tokens` greedy
        steps of `prompt_ids` through base model `model`'s chain (a `Request.model`; "": the
        first) with LoRA `adapter` (a `Request.adapter`, loaded on `model`; None: none),
        timed on `device`'s executor thread (default: the first device that model runs on)
        between its ops. Raises `DirectUnavailable`."""
        ...

    async def start(self) -> None: ...

    async def stop(self, drain: bool = True, timeout_s: float = 30.0) -> None: ...
