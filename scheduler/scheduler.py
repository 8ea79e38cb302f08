"""The scheduler coroutine: a round is collect -> score -> issue; completions come back via on_done.

Rounds run when something changes (an arrival, a completion, an abort),
never by polling. The policy decides what to issue (scheduler/policy.py,
scheduler/slice_policy.py); this module owns request state, KV admission,
the GMG, the executors, and the token streams.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from executors.memory import MemoryLedger
from executors.types import Device, OpInstance, OpState, Priority
from models.loader import Model
from scheduler.api import SchedulerStats
from scheduler.batching import RoundContext
from scheduler.bookkeeping import Bookkeeping
from scheduler.config import SchedulerConfig
from scheduler.execution import Execution, ExecutorFactory, kv_pools
from scheduler.gmg import GMG
from scheduler.ieg import (
    BoundedQueues,
    FinishReason,
    Overloaded,
    Request,
    RequestTooLarge,
    TokenEvent,
)
from scheduler.kv import KVManager
from scheduler.plan import Builder, OpTime, Plan, XferTime, first_token_ops
from scheduler.registry import make_policy
from scheduler.state import Placement, RequestState
from scheduler.stats import collect


class Scheduler:
    """Schedules requests of one model over devices, operator by operator."""

    def __init__(self, model: Model, devices: list[Device], policy: str, op_time: OpTime,
                 xfer_time: XferTime, cfg: SchedulerConfig | None = None,
                 executor_factory: ExecutorFactory | None = None,
                 estimator: Any = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.model, self.cfg = model, cfg or SchedulerConfig(policy=policy)
        self.clock = clock  # monotonic seconds; a virtual clock under fake executors
        self.devices = {d.name: d for d in devices}
        self.policy = make_policy(policy)
        self.estimator = estimator  # observe(op) / mape(), when online refit is on
        self.ledgers = {d.name: MemoryLedger(d.memory_bytes) for d in devices}
        self.kv = KVManager(kv_pools(model, devices, self.ledgers, self.cfg))
        self.gmg = GMG(self.devices, self.ledgers, self.kv)
        self.builder = Builder(model.template, self.cfg.block_size, op_time, xfer_time)
        self.exec = Execution(model, self.devices, self.kv, self.ledgers, self._on_done,
                              executor_factory)
        self.books = Bookkeeping(self.cfg.timeline_size)
        self.waiting: BoundedQueues[RequestState] = BoundedQueues(self.cfg.queue_capacity)
        self.states: dict[str, RequestState] = {}
        self.plans: dict[int, tuple[Plan, int]] = {}  # final op id -> (plan, chunk index)
        self.op_plan: dict[int, Plan] = {}  # op id -> its plan, while the plan is in flight
        self.prefill_inflight: dict[tuple[str, Priority], int] = {}
        self.decode_inflight: set[Placement] = set()
        self.tightest_slo_s: float | None = None  # smallest TTFT SLO among requests seen
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._accepting = False
        self._started_at = clock()

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        self.exec.start(asyncio.get_running_loop())
        self._accepting, self._started_at = True, self.clock()
        self._task = asyncio.create_task(self._loop(), name="slicegate-scheduler")

    async def stop(self, drain: bool = True, timeout_s: float = 30.0) -> None:
        self._accepting = False
        deadline = time.monotonic() + timeout_s
        while drain and self.states and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for rid in list(self.states):
            self.abort(rid, "abort")
        while any(s.in_flight for s in self.states.values()) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if self._task is not None:
            self._task.cancel()
        self.exec.stop()

    async def _loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            t0 = time.perf_counter()
            self.policy.run_round(self._context())
            self.books.round_s.append(time.perf_counter() - t0)
            del self.books.round_s[:-10000]

    # -- submit / abort --------------------------------------------------------------------
    def submit(self, request: Request) -> AsyncIterator[TokenEvent]:
        """Queue a request; raises RequestTooLarge or Overloaded before any token."""
        self._check(request)
        state = RequestState(request, request.build_ieg(self.cfg.max_batch_tokens))
        self.waiting.push(state)
        self.states[request.request_id] = state
        if request.ttft_slo_s is not None:
            self.tightest_slo_s = min(self.tightest_slo_s or request.ttft_slo_s,
                                      request.ttft_slo_s)
        self._wake.set()
        return self._stream(state)

    def _check(self, request: Request) -> None:
        if not self._accepting:
            raise Overloaded("the server is shutting down", retry_after_s=5.0)
        total = len(request.prompt_token_ids) + request.max_tokens
        if total > self.cfg.max_model_len:
            raise RequestTooLarge(f"prompt ({len(request.prompt_token_ids)} tokens) + max_tokens "
                                  f"({request.max_tokens}) exceeds the model's context of "
                                  f"{self.cfg.max_model_len} tokens")
        if not self.kv.can_ever_fit(total):
            raise RequestTooLarge(f"{total} tokens of KV can never fit in one device's cache")
        if request.request_id in self.states:
            raise ValueError(f"duplicate request id {request.request_id}")
        if not self.waiting.can_push(request.priority):
            raise Overloaded(f"too many waiting {request.priority.label}-priority requests",
                             retry_after_s=1.0)

    async def _stream(self, state: RequestState) -> AsyncIterator[TokenEvent]:
        try:
            while True:
                event = await state.events.get()
                yield event
                if event.finish_reason is not None:
                    return
        finally:
            if not state.finished:
                self.abort(state.rid, "abort")

    def abort(self, request_id: str, reason: str) -> None:
        state = self.states.get(request_id)
        if state is None or state.finished:
            return
        fin = FinishReason.STOP if reason == "stop" else FinishReason.ABORT
        if self.waiting.remove(request_id) is not None:
            self._end(state, fin)
        elif state.in_flight:
            state.abort_reason = reason
            self._withdraw(state)
        else:
            self._end(state, fin)
        self._wake.set()

    def _withdraw(self, state: RequestState) -> None:
        """Remove the queued ops of an aborted request's plan when it is alone in it."""
        plan = next((p for p in self.op_plan.values() if state in p.states), None)
        if plan is None or len(plan.states) > 1:
            return  # NOTE: batch-mates still need the ops; the request is dropped at the end
        plan.cancelled = True
        self.exec.cancel(plan.ops)
        if not any(op.state is OpState.RUNNING for op in plan.ops):
            self._plan_done(plan)

    def _end(self, state: RequestState, reason: FinishReason, error: str | None = None) -> None:
        """Finish a request that is not in flight: close its stream and free its KV."""
        state.finish(reason, error)
        self.kv.free(state.rid)
        self.gmg.deadlines.pop(state.rid, None)
        self.states.pop(state.rid, None)

    # -- a round ---------------------------------------------------------------------------
    def _context(self) -> RoundContext:
        runnable = [s for s in self.states.values()
                    if s.placement is not None and not s.in_flight and not s.finished]
        return RoundContext(self.clock(), self.cfg, list(self.devices),
                            len(self.model.template.ops), self.waiting, runnable, self.kv,
                            self.builder, self.gmg, self._admit, self._issue, self._preempt,
                            self.prefill_inflight, self.decode_inflight,
                            self.tightest_slo_s or self.cfg.default_ttft_slo_s)

    def _admit(self, state: RequestState, placement: Placement) -> None:
        reservation = self.kv.reserve(state.rid, set(placement),
                                      state.prompt_len + state.req.max_tokens)
        self.waiting.remove(state.rid)
        state.placement, state.tables = placement, reservation.tables
        if state.req.ttft_deadline is not None and not state.output_ids:
            self.gmg.deadlines[state.rid] = state.req.ttft_deadline

    def _preempt(self, state: RequestState) -> None:
        self.kv.free(state.rid)
        state.placement, state.tables, state.num_computed = None, {}, 0
        state.num_preemptions += 1
        self.books.preemptions[(state.req.tenant, state.priority.label)] += 1
        self.waiting.queue(state.priority).appendleft(state)

    def _issue(self, plan: Plan) -> None:
        self.builder.build(plan, tensors=True)
        now = self.clock()
        self.gmg.add(plan.ops, first_token_ops(plan))
        for i, final in enumerate(plan.finals):
            self.plans[final.op_id] = (plan, i)
        for op in plan.ops:
            self.op_plan[op.op_id] = plan
        for s in plan.states:
            s.in_flight = True
            s.scheduled_time = s.scheduled_time or now
        if _is_prefill(plan):
            key = (plan.placement[0], plan.priority)
            self.prefill_inflight[key] = self.prefill_inflight.get(key, 0) + 1
        else:
            self.decode_inflight.add(plan.placement)
        for op in plan.ops:
            op.issued_at = now
            self.gmg.mark_issued(op)
        self.exec.enqueue(plan.ops)

    # -- completions -----------------------------------------------------------------------
    def _on_done(self, op: OpInstance) -> None:
        self.books.record_op(op)
        plan = self.op_plan.get(op.op_id)
        if plan is None:
            return  # its plan ended already (withdrawn)
        if plan.cancelled:
            if not any(o.state is OpState.RUNNING for o in plan.ops):
                self._plan_done(plan)
            return
        if op.error is not None:
            self._on_fault(op)
            return
        if self.estimator is not None:
            self.estimator.observe(op)
        self.gmg.finish(op)
        entry = self.plans.pop(op.op_id, None)
        if entry is not None:
            plan, index = entry
            self._chunk_done(plan, index, op)
        self._wake.set()

    def _on_fault(self, op: OpInstance) -> None:
        if op.attempts < self.cfg.max_op_attempts:
            self.exec.retry(op)  # NOTE: only this op re-runs; its dependents are still queued
            return
        plan = self.op_plan[op.op_id]
        self.exec.cancel(plan.ops)
        self._plan_done(plan, error=f"{op.name} failed on {op.device}: {op.error}")
        self._wake.set()

    def _chunk_done(self, plan: Plan, index: int, final: OpInstance) -> None:
        chunk = plan.chunks[index]
        for f in chunk:
            f.state.num_computed = f.past + len(f.tokens)
        if final.template_index == len(self.model.template.ops) - 1:
            sampled = [f.state for f in chunk if f.past + len(f.tokens) >= f.state.num_tokens]
            for s, token in zip(sampled, final.output.tolist(), strict=True):
                self._on_token(s, int(token))
        if index == len(plan.chunks) - 1:
            self._plan_done(plan)

    def _on_token(self, s: RequestState, token: int) -> None:
        now = self.clock()
        if s.finished or s.abort_reason is not None:
            return
        s.output_ids.append(token)
        if len(s.output_ids) == 1:
            s.first_token_time = now
            self.gmg.deadlines.pop(s.rid, None)
            self.books.record_ttft(s.priority, now - s.req.arrival_time, s.req.ttft_slo_s)
        s.last_token_time = now
        reason = _finish_reason(s, token)
        s.add_decode_node()
        s.emit(TokenEvent(token, len(s.output_ids) - 1, now, reason))
        if reason is not None:
            s.finished = True

    def _plan_done(self, plan: Plan, error: str | None = None) -> None:
        if _is_prefill(plan):
            self.prefill_inflight[(plan.placement[0], plan.priority)] -= 1
        else:
            self.decode_inflight.discard(plan.placement)
        for op in plan.ops:
            self.op_plan.pop(op.op_id, None)
            self.plans.pop(op.op_id, None)
        self.gmg.remove(plan.ops)
        self.exec.release(plan.ops)
        for s in plan.states:
            s.in_flight = False
            if error is not None:
                self._end(s, FinishReason.ERROR, error)
            elif s.finished:
                self.kv.free(s.rid)
                self.states.pop(s.rid, None)
                s.finish(FinishReason.STOP, emit=False)  # its last token event ended the stream
            elif s.abort_reason is not None:
                self._end(s, FinishReason.STOP if s.abort_reason == "stop" else FinishReason.ABORT)

    # -- views -----------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        return self.gmg.to_json()

    def timeline(self, since: float) -> list[dict[str, Any]]:
        return self.books.since(since)

    def stats(self) -> SchedulerStats:
        return collect(self)


def _is_prefill(plan: Plan) -> bool:
    return any(len(f.tokens) > 1 for c in plan.chunks for f in c)


def _finish_reason(s: RequestState, token: int) -> FinishReason | None:
    p = s.req.sampling
    n = len(s.output_ids)
    if token in p.stop_token_ids and n > p.min_tokens:
        return FinishReason.STOP
    if n >= p.max_tokens:
        return FinishReason.LENGTH
    return None

