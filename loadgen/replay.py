"""Replay several tenants' workloads at once against an OpenAI-compatible server.

Trace and open-loop tenants send each request at its planned arrival time
(open loop: whether or not earlier ones finished); closed-loop tenants keep
``concurrency`` requests in flight. Prompts are built before the clock starts
(closed loops build theirs as they go). Sending stops when every tenant is
done or the duration ends; requests still in flight then get
``drain_timeout_s`` before they are cancelled. With ``handle_signals``, a
first Ctrl-C stops sending (graceful), a second cancels what is in flight;
either way the records so far are returned.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import httpx

from loadgen import progress
from loadgen.client import CompletionCall, RequestRecord, now_s, stream_completion
from loadgen.prefixes import (
    block_tokens,
    counter_delta,
    prefix_counters,
    prompt_from_blocks,
    theoretical_hit_rate,
)
from loadgen.probe import TimelinePoller, first_model, tenant_slos
from loadgen.timeline import OpSpan, merge
from loadgen.traces import TraceRequest
from loadgen.workload import ClosedLoop, OpenLoop, TenantSpec, plan_arrivals

PromptFn = Callable[[int, str], str]  # (num_tokens, unique salt) -> prompt text
_WAIT_TICK_S = 0.2


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    """One replay: where to send, who sends what, and how long."""

    url: str  # base URL, e.g. http://127.0.0.1:8000
    tenants: tuple[TenantSpec, ...]
    model: str | None = None  # None: the first of GET /v1/models
    duration_s: float | None = None  # stop sending after this; None: when every tenant is done
    drain_timeout_s: float = 60.0  # after an early stop, how long in-flight requests may finish
    request_timeout_s: float = 600.0  # per request, connect to last byte
    admin_key: str = ""  # for slicegate's /admin/timeline; "" skips the timeline
    timeline_interval_s: float = 1.0
    dialect: str = "vllm"  # how to ask for exact output lengths (see loadgen.client)
    warmup_requests: int = 0  # per tenant, sent one by one before the clock starts
    progress: bool | None = None  # None: on a terminal only
    handle_signals: bool = False  # SIGINT/SIGTERM stop the replay gracefully (CLI only)

    def __post_init__(self) -> None:
        if not self.tenants:
            raise ValueError("a replay needs at least one tenant")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ValueError(f"duration_s must be > 0, got {self.duration_s}")
        if self.duration_s is None and any(_unbounded(t) for t in self.tenants):
            raise ValueError("a tenant without requests=N runs until the duration ends: "
                             "give a duration")


def _unbounded(tenant: TenantSpec) -> bool:
    """Whether a tenant sends until the duration ends (a batch source without requests=N)."""
    source = tenant.source
    return isinstance(source, ClosedLoop | OpenLoop) and source.num_requests is None


@dataclass(slots=True)
class ReplayResult:
    """Everything a report needs. Times are seconds since ``origin`` unless noted."""

    url: str
    model: str
    tenants: tuple[TenantSpec, ...]
    origin: float  # time.monotonic() at the start
    window_s: float  # measurement window [0, window_s]: until sending stopped early, else the end
    end_s: float  # the last request ended (or was cancelled)
    records: list[RequestRecord] = field(default_factory=list)
    spans: list[OpSpan] = field(default_factory=list)  # server timeline, on our clock
    timeline_error: str | None = None  # why spans is empty, when it is
    server_slos: dict[str, float] = field(default_factory=dict)  # tenant -> TTFT SLO s
    stopped_early: bool = False  # duration ended or interrupted before every tenant was done
    interrupted: bool = False  # Ctrl-C / SIGTERM
    # tenant -> the trace's theoretical prefix cache hit rate (traces with hash_ids only)
    theoretical_hit_rate: dict[str, float] = field(default_factory=dict)
    # tenant (or "*") -> (queries, hits) tokens the server's /metrics gained over the replay
    prefix_counters: dict[str, tuple[float, float]] = field(default_factory=dict)


async def replay(config: ReplayConfig, prompt: PromptFn) -> ReplayResult:
    """Run the replay described by ``config``; ``prompt`` makes the prompt texts."""
    timeout = httpx.Timeout(config.request_timeout_s, connect=10.0)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    async with httpx.AsyncClient(base_url=config.url, timeout=timeout, limits=limits) as client:
        blocks: dict[tuple[int, int], str] = {}
        plans = {t.name: _plan(t, prompt, config.duration_s, blocks) for t in config.tenants
                 if not t.is_closed_loop}
        model = config.model or await first_model(client, config.tenants[0].api_key)
        await _warm_up(client, config, model, prompt, plans)
        # NOTE: the server's prefix cache counters matter for trace replays (shared prompt
        # blocks); other workloads' prompts never share a prefix
        traces = any(block_tokens(t.source) is not None for t in config.tenants)
        before = await prefix_counters(client) if traces else {}
        run = _Run(config, client, model, prompt)
        result = await run.execute(plans)
        if traces:
            result.prefix_counters = counter_delta(before, await prefix_counters(client))
        for t in config.tenants:
            size = block_tokens(t.source)
            sent = [r for r, _ in plans.get(t.name, ())][:sum(1 for rec in result.records
                                                              if rec.tenant == t.name)]
            if size is not None and any(r.hash_ids for r in sent):
                rate = theoretical_hit_rate(sent, size)
                if rate is not None:
                    result.theoretical_hit_rate[t.name] = rate
        return result


async def _warm_up(client: httpx.AsyncClient, config: ReplayConfig, model: str, prompt: PromptFn,
                   plans: dict[str, list[tuple[TraceRequest, str]]]) -> None:
    """Send each tenant's warm-up requests (its first request's shape, at most 8 output tokens);
    RuntimeError if one fails, since the replay would fail the same way."""
    for tenant in config.tenants:
        source = tenant.source
        if isinstance(source, ClosedLoop):
            shape = (source.prompt_tokens, source.output_tokens)
        elif plans[tenant.name]:
            first = plans[tenant.name][0][0]
            shape = (first.prompt_tokens, first.output_tokens)
        else:
            continue
        for i in range(config.warmup_requests):
            call = CompletionCall(model, prompt(shape[0], f"warmup-{tenant.name}-{i}"),
                                  min(shape[1], 8), tenant.api_key, tenant.priority,
                                  config.dialect)
            record = await stream_completion(client, call, RequestRecord(tenant.name, i, 0, 0, 0),
                                             time.monotonic())
            if not record.ok:
                raise RuntimeError(f"warm-up request of tenant {tenant.name!r} failed: "
                                   f"HTTP {record.status}: {record.error}")


def _plan(tenant: TenantSpec, prompt: PromptFn, duration_s: float | None,
          blocks: dict[tuple[int, int], str]) -> list[tuple[TraceRequest, str]]:
    """The tenant's requests and their prompts: from `hash_ids` where the trace has them
    (equal ids, equal blocks: `blocks` holds each id's text), else unique texts."""
    planned = plan_arrivals(tenant.source, duration_s)
    size = block_tokens(tenant.source)
    return [(r, prompt_from_blocks(prompt, r.prompt_tokens, r.hash_ids, size, blocks)
             if size is not None and r.hash_ids else prompt(r.prompt_tokens, f"{tenant.name}-{i}"))
            for i, r in enumerate(planned)]


class _Run:
    """The mutable state of one replay while it runs."""

    def __init__(self, config: ReplayConfig, client: httpx.AsyncClient, model: str,
                 prompt: PromptFn) -> None:
        self.config, self.client, self.model, self.prompt = config, client, model, prompt
        self.origin = time.monotonic()
        self.records: list[RequestRecord] = []
        self.inflight: set[asyncio.Task[RequestRecord]] = set()
        self.stop_sending = asyncio.Event()
        self.cancel_now = asyncio.Event()
        self.stopped_at_s: float | None = None
        self.interrupted = False

    async def execute(self, plans: dict[str, list[tuple[TraceRequest, str]]]) -> ReplayResult:
        self.origin = time.monotonic()
        finished = asyncio.Event()
        poller = TimelinePoller(self.client, self.config.admin_key, self.origin,
                                self.config.timeline_interval_s)
        helpers = [self._background(poller.run(finished))] if self.config.admin_key else []
        if progress.wanted(self.config.progress):
            bar = progress.Progress(self.records, _total(self.config.tenants, plans),
                                    lambda: now_s(self.origin))
            helpers.append(self._background(bar.run(finished)))
        try:
            with _signals(self if self.config.handle_signals else None):
                await self._send_all(plans)
                await self._drain()
        finally:
            finished.set()
            await asyncio.gather(*helpers)
        end_s = max([r.end_s or 0.0 for r in self.records], default=now_s(self.origin))
        return self._result(poller, end_s, await tenant_slos(self.client))

    def _background(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(coro)

    async def _send_all(self, plans: dict[str, list[tuple[TraceRequest, str]]]) -> None:
        drivers = [self._background(self._drive_planned(t, plans[t.name]))
                   if t.name in plans else self._background(self._drive_closed(t))
                   for t in self.config.tenants]
        if self.config.duration_s is not None:
            drivers.append(self._background(self._timer(self.config.duration_s)))
        senders = asyncio.gather(*drivers[: len(self.config.tenants)])
        stop = self._background(self._wait_event(self.stop_sending))
        waiters: list[asyncio.Future[Any]] = [senders, stop]
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for task in [*drivers, stop]:
            task.cancel()
        await asyncio.gather(senders, stop, *drivers, return_exceptions=True)
        error = None if senders.cancelled() else senders.exception()
        # NOTE: drivers cancelled by a stop make the gather hold a CancelledError: no failure.
        if error is not None and not isinstance(error, asyncio.CancelledError):
            await self._drain(cancel=True)
            raise error

    async def _wait_event(self, event: asyncio.Event) -> None:
        await event.wait()

    async def _timer(self, duration_s: float) -> None:
        await asyncio.sleep(max(0.0, self.origin + duration_s - time.monotonic()))
        self.stop("duration")

    def stop(self, why: str) -> None:
        """Stop sending (first call); on a second interruption, cancel what is in flight."""
        if why == "signal":
            if self.interrupted:
                self.cancel_now.set()
            self.interrupted = True
        if not self.stop_sending.is_set():
            self.stopped_at_s = now_s(self.origin)
            self.stop_sending.set()

    async def _drive_planned(self, tenant: TenantSpec,
                             plan: list[tuple[TraceRequest, str]]) -> None:
        for index, (request, text) in enumerate(plan):
            delay = self.origin + request.arrival_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            self._launch(tenant, index, request.prompt_tokens, request.output_tokens, text)

    async def _drive_closed(self, tenant: TenantSpec) -> None:
        source = tenant.source
        assert isinstance(source, ClosedLoop)
        counter = itertools.count()

        async def worker() -> None:
            backoff_s = 0.0
            while (index := next(counter)) < (source.num_requests or float("inf")):
                text = self.prompt(source.prompt_tokens, f"{tenant.name}-{index}")
                task = self._launch(tenant, index, source.prompt_tokens, source.output_tokens,
                                    text)
                # NOTE: shield: stopping this worker must not cancel the request it waits on.
                await asyncio.wait([asyncio.shield(task)])
                # NOTE: a failing server must not turn a closed loop into a hot loop.
                ok = not task.cancelled() and task.result().ok
                backoff_s = 0.0 if ok else min(1.0, max(0.05, 2 * backoff_s))
                if backoff_s:
                    await asyncio.sleep(backoff_s)

        await asyncio.gather(*(worker() for _ in range(source.concurrency)))

    def _launch(self, tenant: TenantSpec, index: int, prompt_tokens: int, output_tokens: int,
                text: str) -> asyncio.Task[RequestRecord]:
        record = RequestRecord(tenant.name, index, now_s(self.origin), prompt_tokens,
                               output_tokens)
        self.records.append(record)
        call = CompletionCall(self.model, text, output_tokens, tenant.api_key, tenant.priority,
                              self.config.dialect)
        task = asyncio.get_running_loop().create_task(
            stream_completion(self.client, call, record, self.origin))
        self.inflight.add(task)
        task.add_done_callback(self.inflight.discard)
        return task

    async def _drain(self, cancel: bool = False) -> None:
        """Wait for in-flight requests; after an early stop, for ``drain_timeout_s`` at most."""
        while self.inflight and not self.cancel_now.is_set() and not cancel:
            if self.stopped_at_s is not None:
                left_s = self.stopped_at_s + self.config.drain_timeout_s - now_s(self.origin)
                if left_s <= 0:
                    break
            await asyncio.wait(set(self.inflight), timeout=_WAIT_TICK_S)
        leftovers = list(self.inflight)
        for task in leftovers:
            task.cancel()
        await asyncio.gather(*leftovers, return_exceptions=True)

    def _result(self, poller: TimelinePoller, end_s: float,
                slos: dict[str, float]) -> ReplayResult:
        error = poller.error if self.config.admin_key else "no admin key given"
        return ReplayResult(
            url=self.config.url, model=self.model, tenants=self.config.tenants,
            origin=self.origin,
            window_s=self.stopped_at_s if self.stopped_at_s is not None else end_s,
            end_s=end_s, records=self.records, spans=merge(poller.spans),
            timeline_error=error if not poller.spans else None, server_slos=slos,
            stopped_early=self.stopped_at_s is not None, interrupted=self.interrupted,
        )


def _total(tenants: tuple[TenantSpec, ...], plans: dict[str, list[Any]]) -> int | None:
    """Requests the replay will send; None when a closed loop runs until the duration ends."""
    total = 0
    for tenant in tenants:
        if isinstance(tenant.source, ClosedLoop):
            if tenant.source.num_requests is None:
                return None
            total += tenant.source.num_requests
        else:
            total += len(plans[tenant.name])
    return total


class _signals:
    """Context manager: SIGINT/SIGTERM call ``run.stop("signal")`` while inside it."""

    def __init__(self, run: _Run | None) -> None:
        self._run = run
        self._signals = (signal.SIGINT, signal.SIGTERM)

    def __enter__(self) -> None:
        if self._run is not None:
            loop = asyncio.get_running_loop()
            for sig in self._signals:
                loop.add_signal_handler(sig, self._run.stop, "signal")

    def __exit__(self, *exc: object) -> None:
        if self._run is not None:
            loop = asyncio.get_running_loop()
            for sig in self._signals:
                loop.remove_signal_handler(sig)
