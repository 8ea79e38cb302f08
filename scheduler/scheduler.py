"""The scheduler coroutine: a round is view -> policy.schedule -> apply; completions via on_done.

Rounds run when something changes (an arrival, a chunk's completion, an abort,
a fault), never by polling. The policy decides (scheduler/policies/); the
scheduler applies the decision to its requests (scheduler/core/requests.py) and
issues the plans (scheduler/round/inflight.py tracks them); their completions are
handled by `Completions` (scheduler/core/completions.py). It supervises all of
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
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any

from executors.types import Device, Priority
from models.loader import Model
from models.lora import AdapterError
from models.modelset import adapters_of
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
from scheduler.core.completions import Completions
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
from scheduler.spec.steps import with_counters

logger = logging.getLogger(__name__)

DOWN_POLL_S = 0.5  # while a device is down, a round runs this often (to see it come back)
_ENDINGS = {"stop": FinishReason.STOP, "error": FinishReason.ERROR}  # abort reason -> finish


class Scheduler(Components):
    """Schedules requests of one model over devices, operator by operator: the request
    lifecycle over the parts that `Components` builds."""

    def __init__(self, model: Model, devices: list[Device], policy: str, op_time: OpTime,
                 xfer_time: XferTime, cfg: SchedulerConfig | None = None,
                 executor_factory: ExecutorFactory | None = None,
                 estimator: Any = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._wake = asyncio.Event()
        self.spec_counters = SpecCounters()  # speculative decoding (scheduler/spec/)
        self.completions = Completions(self, self._wake.set, self.spec_counters)
        super().__init__(model, devices, policy, op_time, xfer_time, self.completions.push,
                         cfg, executor_factory, estimator, clock)
        self.provisioner = Provisioner(self) if self.cfg.provisioning != "off" else None
        self._provision_task: asyncio.Task[None] | None = None
        self._learning_task: asyncio.Task[None] | None = None  # the periodic INFO summary
        self._submitted = False  # a request came since the last round
        self.tightest_tpot_s: float | None = None  # smallest TPOT SLO among requests seen
        self._task: asyncio.Task[None] | None = None
        self._down_poll: asyncio.TimerHandle | None = None  # the next round while degraded
        self._accepting = False
        self._stopping = False

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        self.completions.loop = asyncio.get_running_loop()
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
        if request.adapter is not None and \
                request.adapter not in adapters_of(self.model, request.model):
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
        self.completions.withdraw(plan)

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
        self.completions.retry_on_progress = d.retry_on_progress

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

    # -- views -----------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """The GMG's /admin/gmg view; with provisioning on, each device's replicas too."""
        out = self.gmg.to_json()
        if self.provisioner is not None:
            for device in out["devices"]:
                device["replicas"] = self.replicas.describe(device["device"])
        return out

    async def time_direct(self, prompt_ids: list[int], max_tokens: int,
                          device: str | None = None, model: str = "",
                          adapter: str | None = None) -> DirectTiming:
        return await time_direct(self.exec, self.model, list(self.devices), prompt_ids,
                                 max_tokens, self.cfg.block_size, device, model, adapter)

    def timeline(self, since: float) -> list[dict[str, Any]]:
        self.completions.book()
        return self.books.since(since)

    def stats(self) -> SchedulerStats:
        self.completions.book()
        return with_counters(collect(self), self.spec_counters, self.model_names)

