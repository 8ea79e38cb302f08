"""The baselines `fcfs`, `priority` and `static`: request-level scheduling, as vLLM's.

Each round: decode steps of every runnable request; then per device with no
prefill in flight, one prefill plan packed up to the token budget with the
prompts already running there and newly admitted ones, placed on the
least-loaded device where their KV fits.
"""

from __future__ import annotations

from executors.types import Priority
from scheduler.policies.common import (
    decode_plans,
    fair_order,
    issue_plan,
    preempt_for,
    prefill_feed,
    single,
)
from scheduler.round.decision import RoundDecision
from scheduler.round.draft import Draft
from scheduler.round.plan import Feed, Plan
from scheduler.round.requestview import RequestView
from scheduler.round.view import RoundView

Feeds = dict[str, list[Feed]]  # device -> the prefill feeds of its next plan


class GreedyPolicy:
    """Shared by the baselines: decodes, then prefills packed per device up to a token budget."""

    name = "greedy"
    uses_simulation = False
    uses_priority = True
    preempts = False

    def priority_of(self, r: RequestView) -> Priority:
        return r.priority if self.uses_priority else Priority.NORMAL

    def devices_for(self, view: RoundView, r: RequestView) -> tuple[str, ...]:
        return view.full_holders(r.model)  # NOTE: request-level baselines place whole models

    def order(self, draft: Draft) -> list[RequestView]:
        """Class by class (fair share among a class's tenants), or arrival order for fcfs."""
        if self.uses_priority:
            service = draft.view.service
            return [r for p in Priority
                    for r in fair_order(draft.waiting(p), service.get(p, {}))]
        return sorted((r for p in Priority for r in draft.waiting(p)), key=lambda r: r.arrival_s)

    def schedule(self, view: RoundView) -> RoundDecision:
        draft = Draft(view)
        for plan in decode_plans(draft, self.priority_of):
            issue_plan(draft, plan)
        feeds: Feeds = {d: [] for d in view.devices if not draft.prefills(d)}
        for r in draft.runnable():
            if r.is_prefilling and r.placement and r.placement[0] in feeds:
                self._add(view, feeds[r.placement[0]], r)
        self._admit(draft, feeds)
        for device, packed in feeds.items():
            fs = [f for f in packed if f.rid not in draft.preempted]  # room made for others
            if fs:
                prio = min(self.priority_of(f.req) for f in fs)
                issue_plan(draft, Plan(prio, single(device, view.num_ops), [fs]))
        return draft.decision

    def _add(self, view: RoundView, feeds: list[Feed], r: RequestView) -> None:
        used = _tokens(feeds)
        if used < view.cfg.max_batch_tokens:
            feeds.append(prefill_feed(r, view.cfg.max_batch_tokens - used))

    def _admit(self, draft: Draft, feeds: Feeds) -> None:
        self._admit_list(draft, feeds, self.order(draft))

    def _admit_list(self, draft: Draft, feeds: Feeds, order: list[RequestView]) -> None:
        view = draft.view
        budget = view.cfg.max_batch_tokens
        for r in order:
            open_devs = [d for d in self.devices_for(view, r)
                         if d in feeds and _tokens(feeds[d]) < budget]
            fits = [d for d in open_devs if self._fits(draft, d, r)]
            if not fits:
                if open_devs:
                    break  # NOTE: head-of-line blocking, as a FCFS queue does
                continue
            # NOTE: the least-loaded device, counting the prompts already packed this round
            device = min(fits, key=lambda d: (draft.load(d), _tokens(feeds[d]), d))
            admitted = draft.admit(r, single(device, view.num_ops))
            self._add(view, feeds[device], admitted)

    def _fits(self, draft: Draft, device: str, r: RequestView) -> bool:
        if draft.can_admit(r, single(device, draft.view.num_ops)):
            return True
        return self.preempts and preempt_for(draft, device, r) > 0


def _tokens(feeds: list[Feed]) -> int:
    return sum(f.num_tokens for f in feeds)


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

    def devices_for(self, view: RoundView, r: RequestView) -> tuple[str, ...]:
        devs = view.full_holders(r.model)
        if len(devs) == 1:
            return devs
        half = max(1, len(devs) // 2)
        return devs[:half] if r.priority < Priority.LOW else devs[half:]

    def _admit(self, draft: Draft, feeds: Feeds) -> None:
        # NOTE: each partition is its own queue, so one class never blocks the other
        order = self.order(draft)
        for low in (False, True):
            sub = [r for r in order if (r.priority == Priority.LOW) == low]
            if sub:
                part = {d: f for d, f in feeds.items() if d in self.devices_for(draft.view, sub[0])}
                self._admit_list(draft, part, sub)
