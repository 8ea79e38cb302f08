"""The scheduler coroutine: a round is view -> policy.schedule -> apply; completions via on_done.

Rounds run when something changes (an arrival, a chunk's completion, an abort,
a fault), never by polling. The policy decides (scheduler/policies/); the
scheduler applies the decision to its requests (scheduler/core/requests.py) and
issues the plans (scheduler/round/inflight.py tracks them), and supervises all of
it: an exception in a round or in a completion handler is logged and counted,
the requests it concerned end with a server error, and scheduling goes on.
`stats().healthy` is False while rounds keep failing or once the round task
has ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any

from executors.types import Device, OpInstance, OpState, Priority
from models.loader import Model
from models.logprobs import TokenLogprobs, unpack
from models.lora import AdapterError
from models.modelset import first_model
from models.template import OpKind
from scheduler.api import (
    NO_DEVICE,
    DirectTiming,
    FinishReason,
    Overloaded,
    Request,
    RequestTooLarge,
    SchedulerStats,
    TokenEvent,
)
from scheduler.config import SchedulerConfig
from scheduler.core.admission import EVICTED
from scheduler.core.batches import attach_batches
from scheduler.core.components import Components
from scheduler.core.direct import time_direct
from scheduler.core.execution import ExecutorFactory
from scheduler.core.fairness import counter_of
from scheduler.core.ieg import build_ieg
from scheduler.core.state import RequestState, Status
from scheduler.core.stats import collect
from scheduler.provisioning.provisioner import Provisioner
from scheduler.round.decision import Preemption, RoundDecision
from scheduler.round.plan import OpTime, Plan, XferTime
from scheduler.round.view import RoundView
from scheduler.spec.choice import SpecCounters
from scheduler.spec.steps import book_run, verify_runs, with_counters

logger = logging.getLogger(__name__)

# NOTE: handled ops are booked (estimator refits, timeline: ~45 us an op) this long after
# their completion, when the response they ended has gone out, not on its way (+0.36 ms)
BOOK_AFTER_S = 0.002
DOWN_POLL_S = 0.5  # while a device is down, a round runs this often (to see it come back)
_ENDINGS = {"stop": FinishReason.STOP, "error": FinishReason.ERROR}  # abort reason -> finish


class Scheduler(Components):
    """Schedules requests of one model over devices, operator by operator: the request
    lifecycle over the parts that `Components` builds."""

    def __init__(self, model: Model, devices: list[Device], policy: str, op_time: OpTime,
                 xfer_time: XferTime, cfg: SchedulerConfig | None = None,
                 executor_factory: ExecutorFactory | None = None,
                 estimator: Any = None, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(model, devices, policy, op_time, xfer_time, self._on_done_thread,
                         cfg, executor_factory, estimator, clock)
        self.provisioner = Provisioner(self) if self.cfg.provisioning != "off" else None
        self._provision_task: asyncio.Task[None] | None = None
        self._learning_task: asyncio.Task[None] | None = None  # the periodic INFO summary
        self._retry_on_progress = False  # the last round held work back (see RoundDecision)
        self._submitted = False  # a request came since the last round
        self.tightest_tpot_s: float | None = None  # smallest TPOT SLO among requests seen
        self._wake = asyncio.Event()
        self._done: deque[OpInstance] = deque()  # completions not handled yet (any thread)
        self._booked: list[OpInstance] = []  # handled ops awaiting estimator and timeline
        self._book_timer: asyncio.TimerHandle | None = None  # when `_booked` is booked
        self._event_loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._down_poll: asyncio.TimerHandle | None = None  # the next round while degraded
        self._accepting = False
        self._stopping = False
        self.spec_counters = SpecCounters()  # speculative decoding (scheduler/spec/)

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        self._event_loop = asyncio.get_running_loop()
        self.exec.start()
        self._accepting, self.started_at = True, self.clock()
        self._task = asyncio.create_task(self._loop(), name="slicegate-scheduler")
        self._task.add_done_callback(self._task_ended)
        self._learning_task = asyncio.create_task(self.learning.run(), name="slicegate-learnlog")
        self._learning_task.add_done_callback(self._task_ended)
        if self.provisioner is not None:
            self._provision_task = asyncio.create_task(self.provisioner.run(),
                                                       name="slicegate-provisioner")
            self._provision_task.add_done_callback(self._task_ended)

    async def stop(self, drain: bool = True, timeout_s: float = 30.0) -> None:
        self._accepting = False
        deadline = time.monotonic() + timeout_s
        while drain and self.states and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for rid in list(self.states):
            self.abort(rid, "abort")
        while any(s.in_flight for s in self.states.values()) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        self._stopping = True
        for task in (self._task, self._provision_task, self._learning_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.profiler is not None:
            await self.profiler.stop()
        self.exec.stop()

    async def _loop(self) -> None:
        while True:
            await self._wake.wait()
            if self._submitted:
                # NOTE: one more turn of the loop first: a request just submitted sets up
                # its stream (tasks, first awaits) before its first op is issued, not
                # beside it, holding the GIL from the executor's op. Not after a step:
                # the step's streams (woken first, by its tokens) run in the gap before
                # its round. Handed their tokens after the round instead, to run beside
                # the next step's ops, they made each step 1.2-1.9 ms slower (three A/B
                # pairs on an AVX2-only CPU, one intra-op thread).
                self._submitted = False
                await asyncio.sleep(0)
            self._wake.clear()
            self._round()

    def _task_ended(self, task: asyncio.Task[None]) -> None:
        if self._stopping:
            return
        err = "cancelled" if task.cancelled() else repr(task.exception())
        logger.critical("the scheduler task ended: %s", err)
        self.health.task_error = err
        for state in list(self.states.values()):
            self._fail(state, f"the scheduler stopped: {err}")

    # -- submit / abort --------------------------------------------------------------------
    def submit(self, request: Request) -> AsyncIterator[TokenEvent]:
        """Queue a request; raises RequestTooLarge, Overloaded or (an adapter that is not
        loaded) AdapterError before any token."""
        self._check(request)
        state = RequestState(request, build_ieg(request, self.cfg.max_batch_tokens))
        self._enqueue(state)
        if request.ttft_slo_s is not None:
            self.tightest_slo_s = min(self.tightest_slo_s or request.ttft_slo_s,
                                      request.ttft_slo_s)
        if request.tpot_slo_s is not None:
            self.tightest_tpot_s = min(self.tightest_tpot_s or request.tpot_slo_s,
                                       request.tpot_slo_s)
        self._submitted = True
        self._wake.set()
        return self._stream(state)

    def _check(self, request: Request) -> None:
        if not self._accepting:
            raise Overloaded("the server is shutting down", retry_after_s=5.0)
        if self.health.task_error is not None:
            raise Overloaded("the scheduler is not running", retry_after_s=5.0)
        if self.exec.executors and len(self.exec.down()) == len(self.devices):
            raise Overloaded(f"{NO_DEVICE}: every device is down", retry_after_s=5.0)
        total = len(request.prompt_token_ids) + request.max_tokens
        if total > self.cfg.max_model_len:
            raise RequestTooLarge(f"prompt ({len(request.prompt_token_ids)} tokens) + max_tokens "
                                  f"({request.max_tokens}) exceeds the model's context of "
                                  f"{self.cfg.max_model_len} tokens")
        if not self.kv.can_ever_fit(total, self.model_of(request.model)):
            raise RequestTooLarge(f"{total} tokens of KV can never fit in one device's cache")
        if request.request_id in self.states:
            raise ValueError(f"duplicate request id {request.request_id}")
        request.model = self.model_of(request.model)
        if request.adapter is not None and request.adapter not in self.model.adapters:
            raise AdapterError(f"adapter {request.adapter!r} is not loaded")

    def _enqueue(self, state: RequestState) -> None:
        """Queue a new request, shedding whom admission by work says (scheduler/core/admission.py);
        raises Overloaded with a Retry-After predicted from the queue's drain time."""
        p, now = state.priority, self.clock()
        backlogged = {s.tenant for s in self.requests.waiting.queue(p)}
        try:
            evicted = self.requests.add(state, partial(counter_of, self.fair.counters, p))
        except Overloaded as e:
            e.retry_after_s = self._retry_after_s(p, now)
            raise
        self.fair.on_arrival(p, state.tenant, backlogged)
        for v in evicted:
            why = Overloaded(f"evicted from the {v.priority.label}-priority queue for "
                             f"{p.label}-priority work", self._retry_after_s(v.priority, now),
                             EVICTED)
            self.requests.shed(v, why)
        if p is Priority.LOW and self.cfg.max_low_wait_s is not None:
            asyncio.get_running_loop().call_later(self.cfg.max_low_wait_s, self._wake.set)

    def _retry_after_s(self, priority: Priority, now: float) -> float:
        """When a request of `priority` shed now may find room: the prompt tokens queued at
        its class and above, over the rate at which queued tokens were served lately."""
        ahead = sum(self.requests.waiting.tokens(p) for p in Priority if p <= priority)
        return self.drain.retry_after_s(now, ahead)

    async def _stream(self, state: RequestState) -> AsyncIterator[TokenEvent]:
        try:
            while True:
                event = await state.events.get()
                if event.finish_reason is not None and state.shed is not None:
                    raise state.shed
                yield event
                if event.finish_reason is not None:
                    return
        finally:
            if not state.finished:
                self.abort(state.rid, "abort")

    def requests_on_adapter(self, name: str) -> int:
        """Requests not yet ended (queued, running, or ending with a plan in flight) that run
        with LoRA adapter `name`: the gateway removes an unloaded adapter at 0."""
        return sum(1 for s in list(self.states.values()) if s.req.adapter == name)

    def abort(self, request_id: str, reason: str) -> None:
        """End a request early (`stop`, `abort`, ...); frees its KV. Idempotent."""
        state = self.states.get(request_id)
        if state is None or state.finished:
            return
        self._end_early(state, _ENDINGS.get(reason, FinishReason.ABORT))
        self._wake.set()

    def _fail(self, state: RequestState, error: str) -> None:
        """End a request with a server error (at its plan's end, if it is in flight)."""
        if not state.finished:
            self._end_early(state, FinishReason.ERROR, error)

    def _end_early(self, state: RequestState, reason: FinishReason,
                   error: str | None = None) -> None:
        self.calibration.forget(state.rid)
        if state.in_flight:
            state.ending, state.error = reason, error
            self._withdraw(state)
        else:
            self.requests.end(state, reason, error)

    def _withdraw(self, state: RequestState) -> None:
        """Remove the queued ops of an ending request's plan when it is alone in it."""
        plan = self.inflight.by_request.get(state.rid)
        if plan is None or len(plan.rids) > 1:
            return  # NOTE: batch-mates still need the ops; the request is dropped at the end
        self.inflight.cancel(plan)
        self.exec.cancel(plan.ops)
        if not any(op.state is OpState.RUNNING for op in plan.ops):
            self._plan_done(plan)

    # -- a round ---------------------------------------------------------------------------
    def _round(self) -> None:
        t0 = time.perf_counter()
        decided = False
        try:
            self._handle_down()
            if self.cfg.max_low_wait_s is not None:
                self.requests.age(self.clock() - self.cfg.max_low_wait_s)
            # NOTE: with no request there is nothing to decide: the round that follows the
            # last request's end would only delay its response (~0.13 ms on a slow CPU)
            if decided := bool(self.states):
                view = self._view()
                self._apply(self.policy.schedule(view), view.now)
        except Exception as e:
            self._round_failed(e)
        else:
            self.health.round_ok()
        if decided:
            self.books.record_round(time.perf_counter() - t0)
        if self.profiler is not None and self.estimator is not None:
            pairs = self.estimator.take_pairs_to_profile()
            if pairs:
                self.profiler.request(pairs)

    def _round_failed(self, e: Exception) -> None:
        logger.exception("a scheduling round failed")
        retry_s = self.health.round_failed(f"{type(e).__name__}: {e}")
        if self.health.failing_rounds >= self.cfg.max_failed_rounds:
            for state in [s for s in self.states.values() if not s.in_flight]:
                self._fail(state, f"scheduling failed {self.health.failing_rounds} times in a "
                                  f"row: {type(e).__name__}: {e}")
        asyncio.get_running_loop().call_later(retry_s, self._wake.set)

    def _handle_down(self) -> None:
        """Lost devices: the requests holding KV there are recomputed on the others (back
        to the head of their queue); with no device left, the requests not in flight end."""
        down = self.exec.down()
        if not down:
            return
        for s in list(self.states.values()):
            if s.status is Status.RUNNABLE and s.ending is None and down & set(s.placement or ()):
                lost = ", ".join(sorted(down & set(s.placement or ())))
                self._guard((s.rid,), partial(self.requests.preempt,
                                              Preemption(s.rid, f"device {lost} lost")))
        if len(down) == len(self.devices):
            for s in [s for s in self.states.values() if not s.in_flight]:
                self._fail(s, f"{NO_DEVICE}: every device is down")
        loop = asyncio.get_running_loop()
        if self._down_poll is None or self._down_poll.when() <= loop.time():
            self._down_poll = loop.call_later(DOWN_POLL_S, self._wake.set)

    def _view(self) -> RoundView:
        now = self.clock()
        runnable, running, waiting = self.requests.views()
        pools = self.kv.pools
        snap = self.gmg.snapshot(now) if self.policy.uses_simulation else None
        down = self.exec.down()
        return RoundView(
            now, self.cfg, tuple(d for d in self.devices if d not in down),
            len(self.model.template.ops), waiting, runnable,
            running,
            {d: p.allocator.num_free for d, p in pools.items()},
            {d: int(self.cfg.kv_watermark * p.allocator.num_blocks) for d, p in pools.items()},
            self.cfg.block_size, self.kv.block_bytes(), self.kv.host_free_bytes, snap,
            self.gmg.loads(), self.builder, dict(self.inflight.prefills),
            frozenset(self.inflight.decodes),
            self.tightest_slo_s or self.cfg.default_ttft_slo_s, self.fair.view(),
            None if self.provisioner is None else self.replicas.holders(),
            self.calibration.factors(), frozenset(self.inflight.decode_classes),
            self.model_devices, self.inflight.step_ends(running), self.tightest_tpot_s,
            self.kv.model_pools, {m: self.kv.block_bytes(m) for m in self.kv.model_pools})

    def _apply(self, d: RoundDecision, now: float) -> None:
        """Commit a decision: first what frees KV, then what takes it, then the plans.

        NOTE: the cached blocks admissions count on are pinned first of all, so that no
        allocation of this decision (a migration, another admission, a growth) evicts them."""
        for a in d.admissions:
            self._guard((a.rid,), partial(self.requests.pin, a))
        for p in d.preemptions:
            self._guard((p.rid,), partial(self.requests.preempt, p))
        for m in d.migrations:
            self._guard((m.rid,), partial(self.requests.migrate, m))
        for a in d.admissions:
            self._guard((a.rid,), partial(self.requests.admit, a))
        for g in d.growths:
            self._guard((g.rid,), partial(self.requests.grow, g))
        for plan in d.plans:
            self._guard(plan.rids, partial(self._issue, plan, now))
        for rid in d.blocked:
            if (state := self.states.get(rid)) is not None:
                state.on_blocked()
        for f in d.failures:
            logger.error("deciding for %s failed:\n%s", ", ".join(f.rids), f.traceback)
            self._fail_rids(f.rids, f"scheduling failed: {f.error}")
        self._retry_on_progress = d.retry_on_progress

    def _guard(self, rids: tuple[str, ...], fn: Callable[[], object]) -> None:
        try:
            fn()
        except Exception as e:
            logger.exception("applying a decision for %s failed", ", ".join(rids))
            self._fail_rids(rids, f"scheduling failed: {type(e).__name__}: {e}")

    def _fail_rids(self, rids: tuple[str, ...], error: str) -> None:
        self.health.request_error(error)
        for rid in rids:
            if (state := self.states.get(rid)) is not None:
                self._fail(state, error)

    def _issue(self, plan: Plan, now: float) -> None:
        """Issue the plan's ops as the policy built them; tensors are built by the executors."""
        states = [self._issuable(rid, plan) for rid in plan.rids]
        attach_batches(plan, self.states, self.cfg.block_size, self.devices)
        self.gmg.add(plan.ops, plan.first_tokens)
        self.inflight.add(plan)
        self.calibration.issued(plan, now)
        self.first_rows.issued(plan.ops, self.model.template, self.builder.op_time)
        if self.provisioner is not None:
            self.demand.record(plan.ops, now)
        for op in plan.ops:
            op.issued_at = now
            self.gmg.mark_issued(op)
        for s in states:
            s.status = Status.RUNNING
            s.scheduled_time = s.scheduled_time or now
            s.on_issued()
            if s.journal is not None:
                s.journal.issued_plan(plan, s.rid, s.prompt_len, now)
        self.exec.enqueue(plan.ops)

    def _issuable(self, rid: str, plan: Plan) -> RequestState:
        state = self.states.get(rid)
        if state is None or state.status is not Status.RUNNABLE or state.finished:
            raise ValueError(f"{rid} is not runnable")
        if state.placement != plan.placement:
            raise ValueError(f"{rid} holds KV on {state.placement}, not on {plan.placement}")
        return state

    # -- completions -----------------------------------------------------------------------
    def _on_done_thread(self, op: OpInstance) -> None:
        """An executor finished `op` (called on its thread). Cheap: queue it, and wake the
        loop only when it ends a chunk, failed, belongs to a cancelled plan, or the last
        round held work back; other completions are handled with the next one.

        NOTE: waking the loop for every op made it contend with the executors for the
        GIL during every operator (seen as ~0.1 ms per op at batch 1)."""
        self._done.append(op)
        if op.op_id in self.inflight.urgent or op.error is not None or self._retry_on_progress:
            loop = self._event_loop
            if loop is not None and not loop.is_closed():
                with contextlib.suppress(RuntimeError):  # closed under us at shutdown
                    loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        """Handle every completion queued so far, then book them after the streams ran."""
        while self._done:
            op = self._done.popleft()
            self._on_done(op)
            self._booked.append(op)
        if self._booked and self._book_timer is None:
            self._book_timer = asyncio.get_running_loop().call_later(BOOK_AFTER_S, self._book)

    def _book(self) -> None:
        """Timeline and estimator refits of handled ops: `BOOK_AFTER_S` after their
        completion, once the tokens they released went out; readers of the timeline and
        stats book what is pending first."""
        if self._book_timer is not None:
            self._book_timer.cancel()
            self._book_timer = None
        booked, self._booked = self._booked, []
        for op in booked:
            self.books.record_op(op)
            first = self.first_rows.observed(op)  # NOTE: learnt there, not refit
            if self.estimator is not None and op.error is None and not first:
                self.estimator.observe(op)

    def _on_done(self, op: OpInstance) -> None:
        """An op finished (called on the loop). Never raises: a failure ends its plan."""
        try:
            self._op_done(op)
        except Exception as e:
            logger.exception("handling the completion of %s failed", op.name)
            self.health.request_error(f"{type(e).__name__}: {e}")
            plan = self.inflight.by_op.get(op.op_id)
            if plan is not None:
                self._abandon(plan, f"internal error after {op.name}: {type(e).__name__}: {e}")
            self._wake.set()

    def _abandon(self, plan: Plan, error: str) -> None:
        with contextlib.suppress(Exception):
            self.exec.cancel(plan.ops)
        try:
            self._plan_done(plan, error=error)
        except Exception:
            logger.exception("ending a failed plan raised; ending its requests directly")
            for rid in plan.rids:
                if (state := self.states.get(rid)) is not None:
                    self.requests.end(state, FinishReason.ERROR, error)

    def _op_done(self, op: OpInstance) -> None:
        plan = self.inflight.by_op.get(op.op_id)
        if plan is None:
            return  # its plan ended already (withdrawn)
        if plan.cancelled:
            if not any(o.state is OpState.RUNNING for o in plan.ops):
                self._plan_done(plan)
            return
        if op.error is not None:
            self._on_fault(op, plan)
            return
        self.gmg.finish(op)
        entry = self.inflight.finals.pop(op.op_id, None)
        if entry is not None:
            self._chunk_done(plan, entry[1], op)
            self._wake.set()
        elif self._retry_on_progress:
            self._wake.set()

    def _on_fault(self, op: OpInstance, plan: Plan) -> None:
        down = self.exec.down()
        if down & {o.device for o in plan.ops}:
            if len(down) < len(self.devices):
                # NOTE: a lost device: the plan is withdrawn, and its requests are recomputed
                # on the devices left (`_handle_down`): a delay for the clients, not an error
                self.inflight.cancel(plan)
                self.exec.cancel(plan.ops)
                if not any(o.state is OpState.RUNNING for o in plan.ops):
                    self._plan_done(plan)
                return
            self._abandon(plan, f"{NO_DEVICE}: {op.name} failed on {op.device}: {op.error}")
            self._wake.set()
            return
        if op.attempts < self.cfg.max_op_attempts and self.exec.alive(op.device):
            self.exec.retry(op)  # NOTE: only this op re-runs; its dependents are still queued
            return
        self._abandon(plan, f"{op.name} failed on {op.device}: {op.error}")
        self._wake.set()

    def _chunk_done(self, plan: Plan, index: int, final: OpInstance) -> None:
        chunk = plan.chunks[index]
        now = self.clock()
        head = self.model.template.op(final.template_index).kind is OpKind.HEAD
        runs = verify_runs(chunk, final.output) if head else {}
        for f in chunk:
            if (s := self.states.get(f.rid)) is not None:
                # NOTE: a verify step's KV holds its known token and the accepted drafts;
                # the rejected ones' slots are past `num_computed`, rewritten by later steps
                accepted = len(runs[f.rid]) - 1 if f.rid in runs else 0
                s.num_computed = f.past + f.num_tokens - f.num_draft + accepted
                s.on_computed()
                self.requests.cache(s)
                self.fair.charge(s.priority, s.tenant, f.num_tokens)
                self.drain.record(now, max(0, min(s.prompt_len, f.past + f.num_tokens) - f.past))
        if head:
            tokens, logprobs, prompt = unpack(final.output)
            for f in chunk:
                if f.rid in prompt and (s := self.states.get(f.rid)) is not None:
                    s.record_prompt_logprobs(f.past, prompt[f.rid])
            sampled = [f for f in chunk if f.samples]
            for i, (f, token) in enumerate(zip(sampled, tokens, strict=True)):
                if (s := self.states.get(f.rid)) is None:
                    continue
                if f.rid in runs:
                    self._on_run(s, runs[f.rid])
                else:
                    if s.spec is not None and f.num_tokens == 1:
                        s.spec.acceptance.idle()
                    self._on_token(s, int(token), None if logprobs is None else logprobs[i])
        if index == len(plan.chunks) - 1:
            self._plan_done(plan)

    def _on_run(self, s: RequestState, run: list[int]) -> None:
        """A verify step's tokens: its acceptance booked (scheduler/spec/steps.py), each
        token as a decoded token (a stop among them ends the request there), then its
        rejected drafts' blocks freed."""
        book_run(s.spec, self.spec_counters, run)
        for token in run:
            self._on_token(s, token)
        if not s.finished:
            self.kv.shrink(s.rid, s.num_tokens)

    def _on_token(self, s: RequestState, token: int,
                  logprobs: TokenLogprobs | None = None) -> None:
        now = self.clock()
        if s.finished:
            return
        s.output_ids.append(token)
        if s.req.constraint is not None:
            s.req.constraint.advance(token)  # NOTE: its next mask fills while the chain runs
        self.fair.charge(s.priority, s.tenant, 1)  # NOTE: VTC: an output token costs 2 inputs
        if len(s.output_ids) == 1:
            s.first_token_time = now
            self.calibration.first_token(s.rid, now)
            self.gmg.deadlines.pop(s.rid, None)
            self.books.record_ttft(s.priority, now - s.req.arrival_time, s.req.ttft_slo_s)
        s.last_token_time = now
        reason = _finish_reason(s, token)
        s.add_decode_node()
        first = len(s.output_ids) == 1 and s.req.sampling.prompt_logprobs is not None
        s.emit(TokenEvent(token, len(s.output_ids) - 1, now, reason,
                          num_cached_tokens=s.num_cached_tokens, logprobs=logprobs,
                          prompt_logprobs=tuple(s.prompt_logprobs) if first else None,
                          trace=None if reason is None else s.trace(now)))
        if reason is not None:
            s.ending, s.stream_closed = reason, True

    def _plan_done(self, plan: Plan, error: str | None = None) -> None:
        """A plan is over (completed, withdrawn or failed): its requests are runnable again
        or end, and a round follows (what they held may now fit something else)."""
        self._wake.set()
        held = self.inflight.remove(plan)
        self.gmg.remove(plan.ops)
        self.exec.release(plan.ops)
        now = self.clock()
        for rid in held:
            if (s := self.states.get(rid)) is None:
                continue
            if s.journal is not None:
                s.journal.done(now)
            s.status = Status.RUNNABLE
            if error is not None:
                self.requests.end(s, FinishReason.ERROR, error, emit=not s.stream_closed)
            elif s.ending is not None:
                self.requests.end(s, s.ending, s.error, emit=not s.stream_closed)
        if self.replicas.draining():
            self.actuation.settle()

    # -- views -----------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        return self.gmg.to_json()

    async def time_direct(self, prompt_ids: list[int], max_tokens: int,
                          device: str | None = None) -> DirectTiming:
        return await time_direct(self.exec, first_model(self.model), list(self.devices),
                                 prompt_ids,
                                 max_tokens, self.cfg.block_size, device)

    def timeline(self, since: float) -> list[dict[str, Any]]:
        self._book()
        return self.books.since(since)

    def stats(self) -> SchedulerStats:
        self._book()
        return with_counters(collect(self), self.spec_counters)


def _finish_reason(s: RequestState, token: int) -> FinishReason | None:
    reason = s.req.sampling.finish(token, len(s.output_ids))
    if reason is None and s.req.constraint is not None and s.req.constraint.is_complete:
        return FinishReason.STOP  # the grammar is complete
    return None if reason is None else FinishReason(reason)

