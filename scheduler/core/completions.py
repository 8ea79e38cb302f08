"""What happens when ops finish: the executors hand them over, the event loop handles them.

An executor calls `push` on its own thread; `drain` (on the loop) handles what
was pushed: a chunk's last op hands its tokens to its requests, a failed op is
retried or ends its plan, and a plan that is over makes its requests runnable
again or ends them (`plan_done`); `book` then records the handled ops (timeline,
estimator refits) a little later. `Scheduler` (scheduler/scheduler.py) owns one;
it reads and writes the parts (`Components`) and nothing of the scheduler but
the `wake` it is given and the `retry_on_progress` the last round set.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable

from executors.types import OpInstance, OpState
from models.logprobs import TokenLogprobs, unpack
from models.template import OpKind
from scheduler.api import NO_DEVICE, FinishReason, TokenEvent
from scheduler.core.components import Components
from scheduler.core.state import RequestState, Status
from scheduler.round.plan import Plan
from scheduler.spec.choice import SpecCounters
from scheduler.spec.steps import book_run, verify_runs

logger = logging.getLogger(__name__)

# NOTE: handled ops are booked (estimator refits, timeline: ~45 us an op) this long after
# their completion, when the response they ended has gone out, not on its way (+0.36 ms)
BOOK_AFTER_S = 0.002


class Completions:
    """Finished ops, from the executors' threads to their requests; see the module docstring."""

    def __init__(self, parts: Components, wake: Callable[[], None],
                 spec_counters: SpecCounters) -> None:
        self.parts = parts
        self.wake = wake  # asks for a round
        self.spec_counters = spec_counters  # speculative decoding (scheduler/spec/)
        self.retry_on_progress = False  # the last round held work back (see RoundDecision)
        self.loop: asyncio.AbstractEventLoop | None = None  # set when the scheduler starts
        self._done: deque[OpInstance] = deque()  # completions not handled yet (any thread)
        self._booked: list[OpInstance] = []  # handled ops awaiting estimator and timeline
        self._book_timer: asyncio.TimerHandle | None = None  # when `_booked` is booked

    def push(self, op: OpInstance) -> None:
        """An executor finished `op` (called on its thread). Cheap: queue it, and wake the
        loop only when it ends a chunk, failed, belongs to a cancelled plan, or the last
        round held work back; other completions are handled with the next one.

        NOTE: waking the loop for every op made it contend with the executors for the
        GIL during every operator (seen as ~0.1 ms per op at batch 1)."""
        self._done.append(op)
        if op.op_id in self.parts.inflight.urgent or op.error is not None or self.retry_on_progress:
            loop = self.loop
            if loop is not None and not loop.is_closed():
                with contextlib.suppress(RuntimeError):  # closed under us at shutdown
                    loop.call_soon_threadsafe(self.drain)

    def drain(self) -> None:
        """Handle every completion queued so far, then book them after the streams ran."""
        while self._done:
            op = self._done.popleft()
            self._on_done(op)
            self._booked.append(op)
        if self._booked and self._book_timer is None:
            self._book_timer = asyncio.get_running_loop().call_later(BOOK_AFTER_S, self.book)

    def book(self) -> None:
        """Timeline and estimator refits of handled ops: `BOOK_AFTER_S` after their
        completion, once the tokens they released went out; readers of the timeline and
        stats book what is pending first."""
        if self._book_timer is not None:
            self._book_timer.cancel()
            self._book_timer = None
        booked, self._booked = self._booked, []
        for op in booked:
            self.parts.books.record_op(op)
            first = self.parts.first_rows.observed(op)  # NOTE: learnt there, not refit
            if self.parts.estimator is not None and op.error is None and not first:
                self.parts.estimator.observe(op)

    def _on_done(self, op: OpInstance) -> None:
        """An op finished (called on the loop). Never raises: a failure ends its plan."""
        try:
            self._op_done(op)
        except Exception as e:
            logger.exception("handling the completion of %s failed", op.name)
            self.parts.health.request_error(f"{type(e).__name__}: {e}")
            plan = self.parts.inflight.by_op.get(op.op_id)
            if plan is not None:
                self._abandon(plan, f"internal error after {op.name}: {type(e).__name__}: {e}")
            self.wake()

    def _abandon(self, plan: Plan, error: str) -> None:
        with contextlib.suppress(Exception):
            self.parts.exec.cancel(plan.ops)
        try:
            self.plan_done(plan, error=error)
        except Exception:
            logger.exception("ending a failed plan raised; ending its requests directly")
            for rid in plan.rids:
                if (state := self.parts.states.get(rid)) is not None:
                    self.parts.requests.end(state, FinishReason.ERROR, error)

    def _op_done(self, op: OpInstance) -> None:
        plan = self.parts.inflight.by_op.get(op.op_id)
        if plan is None:
            return  # its plan ended already (withdrawn)
        if plan.cancelled:
            self._end_if_idle(plan)
            return
        if op.error is not None:
            self._on_fault(op, plan)
            return
        self.parts.gmg.finish(op)
        entry = self.parts.inflight.finals.pop(op.op_id, None)
        if entry is not None:
            self._chunk_done(plan, entry[1], op)
            self.wake()
        elif self.retry_on_progress:
            self.wake()

    def _on_fault(self, op: OpInstance, plan: Plan) -> None:
        down = self.parts.exec.down()
        if down & {o.device for o in plan.ops}:
            if len(down) < len(self.parts.devices):
                # NOTE: a lost device: the plan is withdrawn, and its requests are recomputed
                # on the devices left (`Scheduler._handle_down`): a delay, not an error
                self.withdraw(plan)
                return
            self._abandon(plan, f"{NO_DEVICE}: {op.name} failed on {op.device}: {op.error}")
            self.wake()
            return
        if op.attempts < self.parts.cfg.max_op_attempts and self.parts.exec.alive(op.device):
            self.parts.exec.retry(op)  # NOTE: only this op re-runs; its dependents are still queued
            return
        self._abandon(plan, f"{op.name} failed on {op.device}: {op.error}")
        self.wake()

    def _chunk_done(self, plan: Plan, index: int, final: OpInstance) -> None:
        chunk = plan.chunks[index]
        now = self.parts.clock()
        head = self.parts.model.template.op(final.template_index).kind is OpKind.HEAD
        runs = verify_runs(chunk, final.output) if head else {}
        for f in chunk:
            if (s := self.parts.states.get(f.rid)) is not None:
                # NOTE: a verify step's KV holds its known token and the accepted drafts;
                # the rejected ones' slots are past `num_computed`, rewritten by later steps
                accepted = len(runs[f.rid]) - 1 if f.rid in runs else 0
                s.num_computed = f.past + f.num_tokens - f.num_draft + accepted
                s.on_computed()
                self.parts.requests.cache(s)
                self.parts.fair.charge(s.priority, s.tenant, f.num_tokens)
                prompt_fed = max(0, min(s.prompt_len, f.past + f.num_tokens) - f.past)
                self.parts.drain.record(now, prompt_fed)
        if head:
            tokens, logprobs, prompt = unpack(final.output)
            for f in chunk:
                if f.rid in prompt and (s := self.parts.states.get(f.rid)) is not None:
                    s.record_prompt_logprobs(f.past, prompt[f.rid])
            sampled = [f for f in chunk if f.samples]
            for i, (f, token) in enumerate(zip(sampled, tokens, strict=True)):
                if (s := self.parts.states.get(f.rid)) is None:
                    continue
                if f.rid in runs:
                    self._on_run(s, runs[f.rid])
                else:
                    if s.spec is not None and f.num_tokens == 1:
                        s.spec.acceptance.idle()
                    self._on_token(s, int(token), None if logprobs is None else logprobs[i])
        if index == len(plan.chunks) - 1:
            self.plan_done(plan)

    def _on_run(self, s: RequestState, run: list[int]) -> None:
        """A verify step's tokens: its acceptance booked (scheduler/spec/steps.py), each
        token as a decoded token (a stop among them ends the request there), then its
        rejected drafts' blocks freed."""
        book_run(s.spec, self.spec_counters, run, s.req.model)
        for token in run:
            self._on_token(s, token)
        if not s.finished:
            self.parts.kv.shrink(s.rid, s.num_tokens)

    def _on_token(self, s: RequestState, token: int,
                  logprobs: TokenLogprobs | None = None) -> None:
        now = self.parts.clock()
        if s.finished:
            return
        s.output_ids.append(token)
        if s.req.constraint is not None:
            s.req.constraint.advance(token)  # NOTE: its next mask fills while the chain runs
        self.parts.fair.charge(s.priority, s.tenant, 1)  # NOTE: VTC: an output token costs 2 inputs
        if len(s.output_ids) == 1:
            s.first_token_time = now
            self.parts.calibration.first_token(s.rid, now)
            self.parts.gmg.deadlines.pop(s.rid, None)
            self.parts.books.record_ttft(s.priority, now - s.req.arrival_time, s.req.ttft_slo_s,
                                         s.req.model)
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

    def withdraw(self, plan: Plan) -> None:
        """Cancel a plan's queued ops; it is over once none of its ops runs any more."""
        self.parts.inflight.cancel(plan)
        self.parts.exec.cancel(plan.ops)
        self._end_if_idle(plan)

    def _end_if_idle(self, plan: Plan) -> None:
        if not any(o.state is OpState.RUNNING for o in plan.ops):
            self.plan_done(plan)

    def plan_done(self, plan: Plan, error: str | None = None) -> None:
        """A plan is over (completed, withdrawn or failed): its requests are runnable again
        or end, and a round follows (what they held may now fit something else)."""
        self.wake()
        held = self.parts.inflight.remove(plan)
        self.parts.gmg.remove(plan.ops)
        self.parts.exec.release(plan.ops)
        now = self.parts.clock()
        for rid in held:
            if (s := self.parts.states.get(rid)) is None:
                continue
            if s.journal is not None:
                s.journal.done(now)
            s.status = Status.RUNNABLE
            if error is not None:
                self.parts.requests.end(s, FinishReason.ERROR, error, emit=not s.stream_closed)
            elif s.ending is not None:
                self.parts.requests.end(s, s.ending, s.error, emit=not s.stream_closed)
        if self.parts.replicas.draining():
            self.parts.actuation.settle()


def _finish_reason(s: RequestState, token: int) -> FinishReason | None:
    reason = s.req.sampling.finish(token, len(s.output_ids))
    if reason is None and s.req.constraint is not None and s.req.constraint.is_complete:
        return FinishReason.STOP  # the grammar is complete
    return None if reason is None else FinishReason(reason)

