"""Scheduling policies, selected by name: `fcfs`, `priority`, `static` (baselines) and `slice`.

A policy runs once per round over a `RoundContext` and issues plans through
`ctx.issue`. The baselines batch greedily on the least-loaded device and keep
at most one prefill plan in flight per device, as a request-level scheduler
(vLLM's) does; only `slice` looks ahead by simulation (scheduler/slice_policy.py).
"""

from __future__ import annotations

from typing import Protocol

from executors.types import Priority
from scheduler.batching import RoundContext, decode_plans, kv_tokens, prefill_feed, single
from scheduler.plan import Feed, Plan
from scheduler.state import RequestState


class Policy(Protocol):
    name: str

    def run_round(self, ctx: RoundContext) -> None: ...


class GreedyPolicy:
    """Shared by the baselines: decodes, then prefills packed per device up to a token budget."""

    name = "greedy"
    uses_priority = True
    preempts = False

    def priority_of(self, s: RequestState) -> Priority:
        return s.priority if self.uses_priority else Priority.NORMAL

    def devices_for(self, ctx: RoundContext, s: RequestState) -> list[str]:
        return ctx.devices

    def order(self, ctx: RoundContext) -> list[RequestState]:
        waiting = [s for p in Priority for s in ctx.waiting.queue(p)]
        if self.uses_priority:
            return sorted(waiting, key=lambda s: (s.priority, s.req.arrival_time))
        return sorted(waiting, key=lambda s: s.req.arrival_time)

    def run_round(self, ctx: RoundContext) -> None:
        for plan in decode_plans(ctx, self.priority_of):
            ctx.issue(plan)
        feeds: dict[str, list[Feed]] = {d: [] for d in ctx.devices if not ctx.prefills(d)}
        for s in ctx.runnable:
            if s.is_prefilling and s.placement and s.placement[0] in feeds:
                self._add(ctx, feeds[s.placement[0]], s)
        self._admit(ctx, feeds)
        for device, fs in feeds.items():
            if fs:
                prio = min(self.priority_of(f.state) for f in fs)
                ctx.issue(Plan(prio, single(device, ctx.num_ops), [fs]))

    def _add(self, ctx: RoundContext, feeds: list[Feed], s: RequestState) -> bool:
        used = sum(len(f.tokens) for f in feeds)
        if used >= ctx.cfg.max_batch_tokens:
            return False
        feeds.append(prefill_feed(s, ctx.cfg.max_batch_tokens - used))
        return True

    def _admit(self, ctx: RoundContext, feeds: dict[str, list[Feed]]) -> None:
        self._admit_list(ctx, feeds, self.order(ctx))

    def _admit_list(self, ctx: RoundContext, feeds: dict[str, list[Feed]],
                    order: list[RequestState]) -> None:
        for s in order:
            open_devs = [d for d in self.devices_for(ctx, s) if d in feeds]
            fits = [d for d in open_devs if self._fits(ctx, d, s)]
            if not fits:
                if open_devs:
                    break  # NOTE: head-of-line blocking, as a FCFS queue does
                continue
            device = ctx.least_loaded(fits)
            if sum(len(f.tokens) for f in feeds[device]) >= ctx.cfg.max_batch_tokens:
                break
            ctx.admit(s, single(device, ctx.num_ops))
            self._add(ctx, feeds[device], s)

    def _fits(self, ctx: RoundContext, device: str, s: RequestState) -> bool:
        if ctx.kv.can_reserve({device}, kv_tokens(s)):
            return True
        return self.preempts and preempt_for(ctx, device, s)


def preempt_for(ctx: RoundContext, device: str, s: RequestState) -> bool:
    """Free KV of lower-priority runnable requests on `device` (newest first) until `s` fits."""
    victims = sorted((v for v in ctx.runnable if v.priority > s.priority and v.placement
                      and device in v.placement and not v.in_flight),
                     key=lambda v: -v.req.arrival_time)
    for v in victims:
        ctx.preempt(v)
        if ctx.kv.can_reserve({device}, kv_tokens(s)):
            return True
    return ctx.kv.can_reserve({device}, kv_tokens(s))


class FcfsPolicy(GreedyPolicy):
    """One queue in arrival order, no priorities (vLLM's default)."""

    name = "fcfs"
    uses_priority = False


class PriorityPolicy(GreedyPolicy):
    """Strict priority by class then arrival; low-priority requests preempted for KV."""

    name = "priority"
    preempts = True


class StaticPolicy(GreedyPolicy):
    """Devices split between classes at start-up: first half high+normal, the rest low."""

    name = "static"

    def devices_for(self, ctx: RoundContext, s: RequestState) -> list[str]:
        half = max(1, len(ctx.devices) // 2)
        if len(ctx.devices) == 1:
            return ctx.devices
        return ctx.devices[:half] if s.priority < Priority.LOW else ctx.devices[half:]

    def _admit(self, ctx: RoundContext, feeds: dict[str, list[Feed]]) -> None:
        # NOTE: each partition is its own queue, so one class never blocks the other
        order = self.order(ctx)
        for low in (False, True):
            sub = [s for s in order if (s.priority == Priority.LOW) == low]
            if sub:
                part = {d: f for d, f in feeds.items() if d in self.devices_for(ctx, sub[0])}
                self._admit_list(ctx, part, sub)
