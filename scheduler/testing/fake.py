"""A scheduler without a model, for gateway tests and demos.

`FakeScheduler` implements `SchedulerAPI` with the real admission rules
(context limit, bounded waiting queues per class, KV blocks reserved per
request and freed on finish or abort) and deterministic tokens: a request's
tokens are a pure function of its prompt ids and seed, drawn from a pool of
ids. One decode step (one token for every running request) takes
`token_delay_s` of wall time.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import time
from collections import Counter, deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

from executors.types import Priority
from models.logprobs import TokenLogprobs
from scheduler.api import (
    DirectTiming,
    DirectUnavailable,
    FinishReason,
    Overloaded,
    PlanRun,
    Request,
    RequestTooLarge,
    RequestTrace,
    SchedulerStats,
    TokenEvent,
)
from scheduler.core.ieg import NodeState
from scheduler.testing.queues import BoundedQueues


@dataclass(frozen=True, slots=True)
class FakeConfig:
    """Knobs of the fake. Counts are tokens or blocks unless a unit says otherwise."""

    vocab_size: int = 32000
    token_ids: tuple[int, ...] = ()  # pool tokens are drawn from; empty = range(vocab_size)
    token_delay_s: float = 0.0  # wall time of one decode step
    max_model_len: int = 2048  # prompt + max_tokens limit (RequestTooLarge beyond)
    max_running: int = 256  # requests decoding at once; the rest wait
    max_waiting_per_class: int = 1024  # Overloaded beyond
    kv_block_tokens: int = 16
    num_kv_blocks: int = 1 << 16
    eos_after: int | None = None  # emit stop_token_ids[0] as token #eos_after (>= min_tokens)
    error_after: int | None = None  # end with FinishReason.ERROR after this many tokens
    script: tuple[int, ...] = ()  # every request's first tokens, in order; then its first
    # stop token (if it has one), as a model that says this and ends
    device: str = "cpu:0"

    def __post_init__(self) -> None:
        if self.vocab_size < 1:
            raise ValueError("vocab_size must be >= 1")
        if any(not 0 <= t < self.vocab_size for t in (*self.token_ids, *self.script)):
            raise ValueError("token_ids and script must lie in [0, vocab_size)")
        if self.token_delay_s < 0:
            raise ValueError("token_delay_s must be >= 0")
        if min(self.max_model_len, self.max_running, self.kv_block_tokens,
               self.num_kv_blocks) < 1:
            raise ValueError("max_model_len, max_running, kv_block_tokens and "
                             "num_kv_blocks must be >= 1")


@dataclass(slots=True, eq=False)
class _Slot:
    """One admitted request: its event queue, RNG and KV reservation."""

    request: Request
    rng: random.Random
    events: asyncio.Queue[TokenEvent] = field(default_factory=asyncio.Queue)
    state: NodeState = NodeState.READY
    num_blocks: int = 0
    num_generated: int = 0
    admitted_time: float | None = None  # monotonic s it started running
    first_token_time: float | None = None


def _rng_for(request: Request) -> random.Random:
    seed = request.sampling.seed or 0
    digest = hashlib.blake2b(repr((seed, request.prompt_token_ids)).encode(), digest_size=8)
    return random.Random(int.from_bytes(digest.digest(), "little"))


class FakeScheduler:
    """`SchedulerAPI` without a model (see the module docstring)."""

    def __init__(self, config: FakeConfig | None = None) -> None:
        self.config = config or FakeConfig()
        self.healthy = True  # tests flip this to exercise /health
        self.abort_reasons: Counter[str] = Counter()  # reason -> aborts that ended a request
        self._pool = self.config.token_ids or tuple(range(self.config.vocab_size))
        self._slots: dict[str, _Slot] = {}
        capacity = dict.fromkeys(Priority, self.config.max_waiting_per_class)
        self._waiting: BoundedQueues[Request] = BoundedQueues(capacity)
        self._running: list[_Slot] = []
        self._used_blocks = 0
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._accepting = True
        self._timeline: deque[dict[str, Any]] = deque(maxlen=10_000)
        self._busy_s = 0.0
        self._started_at = time.monotonic()
        self._ttft_met: Counter[tuple[str, bool]] = Counter()  # (class, met) -> requests

    # ---- SchedulerAPI -------------------------------------------------------------------

    def submit(self, request: Request) -> AsyncIterator[TokenEvent]:
        """Admit `request` (raises RequestTooLarge / Overloaded) and stream its tokens."""
        if not self._accepting:
            raise Overloaded("the scheduler is shutting down", retry_after_s=5.0)
        if self._task is None:
            raise RuntimeError("FakeScheduler.start() must be awaited before submit()")
        if request.request_id in self._slots:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        self._check_fits(request)
        self._waiting.push(request)  # raises Overloaded when the class's queue is full
        slot = _Slot(request, _rng_for(request))
        self._slots[request.request_id] = slot
        self._idle.clear()
        self._wake.set()
        return self._stream(slot)

    def abort(self, request_id: str, reason: str) -> None:
        """End a waiting or running request with FinishReason.ABORT. Idempotent."""
        slot = self._slots.get(request_id)
        if slot is None:
            return
        self.abort_reasons[reason] += 1
        self._finish(slot, TokenEvent(None, slot.num_generated, time.monotonic(),
                                      FinishReason.ABORT))

    def stats(self) -> SchedulerStats:
        running: Counter[tuple[str, str]] = Counter()
        for slot in self._running:
            running[_key(slot.request)] += 1
        waiting: Counter[tuple[str, str]] = Counter(
            _key(s.request) for s in self._slots.values() if s.state is NodeState.READY)
        elapsed = max(time.monotonic() - self._started_at, 1e-9)
        return SchedulerStats(
            num_running=dict(running),
            num_waiting=dict(waiting),
            kv_cache_usage=self._used_blocks / self.config.num_kv_blocks,
            slo_attainment=self._slo_attainment(),
            device_busy_ratio={self.config.device: min(self._busy_s / elapsed, 1.0)},
            healthy=self.healthy,
            health_detail=None if self.healthy else "the fake scheduler was marked unhealthy",
        )

    def snapshot(self) -> dict[str, Any]:
        return {
            "devices": [{
                "name": self.config.device,
                "kv_blocks_total": self.config.num_kv_blocks,
                "kv_blocks_used": self._used_blocks,
            }],
            "requests": [_describe(s) for s in self._slots.values()],
        }

    def timeline(self, since: float) -> list[dict[str, Any]]:
        return [r for r in self._timeline if r["end"] >= since]

    async def time_direct(self, prompt_ids: list[int], max_tokens: int,
                          device: str | None = None, model: str = "",
                          adapter: str | None = None) -> DirectTiming:
        """A step of `token_delay_s` per token, slept and timed."""
        if device not in (None, self.config.device):
            raise DirectUnavailable(f"This server has no device {device!r}; it has "
                                    f"{self.config.device}.")
        t0 = time.perf_counter()
        await asyncio.sleep(self.config.token_delay_s)
        first = time.perf_counter() - t0
        await asyncio.sleep(self.config.token_delay_s * (max_tokens - 1))
        return DirectTiming(self.config.device, first, time.perf_counter() - t0)

    async def start(self) -> None:
        if self._task is None:
            self._started_at = time.monotonic()
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self, drain: bool = True, timeout_s: float = 30.0) -> None:
        """Stop accepting; with `drain`, let in-flight requests finish for up to `timeout_s`."""
        self._accepting = False
        if drain and self._slots:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), timeout_s)
        for request_id in list(self._slots):
            self.abort(request_id, "shutdown")
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # ---- what tests read ----------------------------------------------------------------

    @property
    def kv_blocks_in_use(self) -> int:
        return self._used_blocks

    @property
    def num_requests(self) -> int:
        """Requests admitted and not yet finished (waiting or running)."""
        return len(self._slots)

    # ---- internals ----------------------------------------------------------------------

    def _blocks_for(self, request: Request) -> int:
        tokens = len(request.prompt_token_ids) + request.max_tokens
        return -(-tokens // self.config.kv_block_tokens)

    def _check_fits(self, request: Request) -> None:
        total = len(request.prompt_token_ids) + request.max_tokens
        if total > self.config.max_model_len:
            raise RequestTooLarge(f"prompt + max_tokens = {total} tokens exceeds the "
                                  f"context limit of {self.config.max_model_len}")
        if self._blocks_for(request) > self.config.num_kv_blocks:
            raise RequestTooLarge("the request needs more KV blocks than the device has")
        if any(not 0 <= t < self.config.vocab_size for t in request.prompt_token_ids):
            raise RequestTooLarge("prompt token id out of the vocabulary")

    async def _stream(self, slot: _Slot) -> AsyncIterator[TokenEvent]:
        try:
            while True:
                event = await slot.events.get()
                yield event
                if event.finish_reason is not None:
                    return
        finally:
            # NOTE: a consumer that walks away without calling abort() still frees its KV.
            self.abort(slot.request.request_id, "abort")

    async def _run(self) -> None:
        while True:
            self._admit()
            if not self._running:
                self._wake.clear()
                await self._wake.wait()
                continue
            start = time.monotonic()
            await asyncio.sleep(self.config.token_delay_s)
            self._step(start)

    def _admit(self) -> None:
        for priority in Priority:
            queue = self._waiting.queue(priority)
            while queue and len(self._running) < self.config.max_running:
                blocks = self._blocks_for(queue[0])
                if self._used_blocks + blocks > self.config.num_kv_blocks:
                    return
                slot = self._slots[queue.popleft().request_id]
                slot.num_blocks = blocks
                self._used_blocks += blocks
                slot.state = NodeState.RUNNING
                slot.admitted_time = time.monotonic()
                self._running.append(slot)

    def _step(self, start: float) -> None:
        batch = list(self._running)  # requests aborted during the step's sleep are gone
        if not batch:
            return
        for slot in batch:
            if slot.request.request_id in self._slots:
                self._emit(slot)
        end = time.monotonic()
        self._busy_s += end - start
        best = min(s.request.priority for s in batch)
        self._timeline.append({"device": self.config.device, "op": "decode",
                               "class": best.label, "num_requests": len(batch),
                               "requests": tuple(s.request.request_id for s in batch),
                               "start": start, "end": end})

    def _emit(self, slot: _Slot) -> None:
        now = time.monotonic()
        index = slot.num_generated
        if self.config.error_after is not None and index >= self.config.error_after:
            self._finish(slot, TokenEvent(None, index, now, FinishReason.ERROR,
                                          error="fake scheduler: injected error"))
            return
        token = self._next_token(slot)
        slot.num_generated += 1
        if slot.first_token_time is None:
            slot.first_token_time = now
            self._record_ttft(slot)
        end = slot.request.sampling.finish(token, slot.num_generated)
        reason = None if end is None else FinishReason(end)
        event = TokenEvent(token, index, now, reason, logprobs=self._logprobs(slot, token),
                           prompt_logprobs=self._prompt_logprobs(slot.request, index))
        if reason is None:
            slot.events.put_nowait(event)
        else:
            self._finish(slot, event)

    def _logprobs(self, slot: _Slot, token: int) -> TokenLogprobs | None:
        """Plausible log-probs when asked: the token first among its alternatives, at
        -0.1, -1.1, -2.1, ... (the others drawn from the pool)."""
        k = slot.request.sampling.logprobs
        if k is None:
            return None
        others = [t for t in self._pool[:k + 1] if t != token][:max(k - 1, 0)]
        top = ([token] + others)[:k]
        return TokenLogprobs(token, -0.1, tuple(top), tuple(-0.1 - i for i in range(len(top))))

    @staticmethod
    def _prompt_logprobs(request: Request, index: int
                         ) -> tuple[TokenLogprobs | None, ...] | None:
        """With the first token, when asked: each prompt token at -1.0, top-1 itself."""
        k = request.sampling.prompt_logprobs
        if k is None or index != 0:
            return None
        ids = request.prompt_token_ids
        return (None, *(TokenLogprobs(t, -1.0, (t,)[:k], (-1.0,)[:k]) for t in ids[1:]))

    def _next_token(self, slot: _Slot) -> int:
        sampling = slot.request.sampling
        index = slot.num_generated
        stops = sampling.stop_token_ids
        eos_after = self.config.eos_after
        script = self.config.script
        if script:
            return script[index] if index < len(script) else (stops or self._pool)[0]
        if stops and eos_after is not None and index >= max(eos_after, sampling.min_tokens):
            return stops[0]
        token = self._pool[slot.rng.randrange(len(self._pool))]
        if index < sampling.min_tokens:  # stop tokens are masked until min_tokens
            allowed = [t for t in self._pool if t not in stops]
            if token in stops and allowed:
                token = allowed[slot.rng.randrange(len(allowed))]
        return token

    def _finish(self, slot: _Slot, event: TokenEvent) -> None:
        request_id = slot.request.request_id
        if slot.state is NodeState.READY:
            self._waiting.remove(request_id)
        elif slot in self._running:
            self._running.remove(slot)
        self._used_blocks -= slot.num_blocks
        slot.num_blocks = 0
        slot.state = (NodeState.ABORTED if event.finish_reason is FinishReason.ABORT
                      else NodeState.FAILED if event.finish_reason is FinishReason.ERROR
                      else NodeState.COMPLETED)
        del self._slots[request_id]
        if slot.request.trace:
            event = replace(event, trace=self._trace(slot, event.time))
        slot.events.put_nowait(event)
        if not self._slots:
            self._idle.set()

    def _trace(self, slot: _Slot, now: float) -> RequestTrace:
        """A prefill run to its first token, then a decode run, on the fake's one device."""
        runs: list[PlanRun] = []
        start, first = slot.admitted_time, slot.first_token_time
        devices = (self.config.device,)
        if start is not None:
            prompt = len(slot.request.prompt_token_ids)
            runs.append(PlanRun("prefill", devices, start, first or now, 1, prompt, 1))
        if first is not None and slot.num_generated > 1:
            steps = slot.num_generated - 1
            runs.append(PlanRun("decode", devices, first, now, steps, steps, 1))
        return RequestTrace(start, 0, tuple(runs))

    def _record_ttft(self, slot: _Slot) -> None:
        deadline = slot.request.ttft_deadline
        if deadline is not None and slot.first_token_time is not None:
            met = slot.first_token_time <= deadline
            self._ttft_met[(slot.request.priority.label, met)] += 1

    def _slo_attainment(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for p in Priority:
            met, missed = self._ttft_met[(p.label, True)], self._ttft_met[(p.label, False)]
            if met + missed:
                out[p.label] = met / (met + missed)
        return out


def _key(request: Request) -> tuple[str, str]:
    return request.tenant, request.priority.label


def _describe(slot: _Slot) -> dict[str, Any]:
    return {
        "request_id": slot.request.request_id,
        "tenant": slot.request.tenant,
        "priority": slot.request.priority.label,
        "state": slot.state.value,
        "num_prompt_tokens": len(slot.request.prompt_token_ids),
        "num_generated": slot.num_generated,
        "kv_blocks": slot.num_blocks,
    }
