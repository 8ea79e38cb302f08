"""`slice`: the full design. Placements chosen by what-if simulation of the GMG.

Each round: high-priority prefills by earliest TTFT deadline (then normal),
each placed on the candidate partition (one device, a layer split over two,
or a chunked pipeline over that split, more chunks tried only while they
help; for a long prompt the others bring near its deadline, one device with
another's cores lent to it: `policies.candidates`) with the earliest expected first
token, plus the delay it adds to requests of its class decoding on its
devices, that keeps its deadline (while every device runs a prefill of their
class they wait, and the next plan on one device packs the whole prompts of
those waiting, and the next decode step of requests of that class decoding
there, into its batch where that keeps the deadlines; a plan for one device
where a decode step of its class is in flight waits for that step to end, so
that its requests ride along, and so do later requests whose best plan would use
that device; a waiting request is not simulated again until a plan in flight ends);
then decode steps,
one per class; then low-priority prefills, packed into one plan per device
of at most as many tokens as keep one layer group well inside the tightest
SLO, each issued only if the simulation predicts that no request with a TTFT
deadline misses it because of that batch. OOM candidates are discarded,
never tried.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from executors.types import Priority
from scheduler.policies.burst import (
    MAX_BURST,
    BurstJob,
    Spread,
    burst_schedule,
    in_burst_order,
)
from scheduler.policies.candidates import (
    MIN_PIPELINE_TOKENS,
    Ladder,
    batches,
    pipelines,
    wide_candidates,
)
from scheduler.policies.common import (
    decode_plans,
    issue_plan,
    placements,
    preempt_for,
    prefill_feed,
    single,
    split,
)
from scheduler.policies.lowfill import fill_low
from scheduler.policies.scoring import (
    Scored,
    grown_plan,
    harmless,
    log_choice,
    prefilling,
    score,
    step_first,
)
from scheduler.round.decision import RoundDecision
from scheduler.round.draft import Draft
from scheduler.round.plan import Feed, Plan
from scheduler.round.requestview import Placement, RequestView
from scheduler.round.view import RoundView
from scheduler.sim.gmg import Snapshot
from scheduler.sim.simulator import simulate
from scheduler.sim.types import Candidate, Prediction

Simulate = Callable[[Snapshot, Candidate | None], Prediction]  # the what-if simulator


class SlicePolicy:
    name = "slice"
    uses_simulation = True

    def __init__(self, sim: Simulate = simulate) -> None:
        self._sim = sim  # NOTE: a test or a bench may pass one that records every call
        # request -> (what its wait depended on, the device it waits for): see `_still_held`
        self._held: dict[str, tuple[object, str]] = {}
        self._held_next: dict[str, tuple[object, str]] = {}

    def schedule(self, view: RoundView) -> RoundDecision:
        draft = Draft(view, self._sim)
        self._held_next = {}
        for prio in (Priority.HIGH, Priority.NORMAL):
            self._urgent(draft, prio)
        self._held = self._held_next
        for r in draft.runnable():
            if len(set(r.placement or ())) > 1 and not r.is_prefilling:
                draft.attempt([r.rid], partial(self._migrate, draft, r))
        for plan in decode_plans(draft, lambda r: r.priority):
            draft.attempt(plan.rids, partial(self._decode, draft, plan))
        fill_low(draft)
        return draft.decision

    # -- high / normal -----------------------------------------------------------------------
    def _urgent(self, draft: Draft, prio: Priority) -> None:
        budget = draft.view.cfg.max_batch_tokens
        for r in [r for r in draft.runnable() if r.priority == prio and r.is_prefilling]:
            assert r.placement is not None
            issue_plan(draft, Plan(prio, r.placement, [[prefill_feed(r, budget)]]))
        waiting = sorted(draft.waiting(prio),
                         key=lambda r: (r.ttft_deadline or float("inf"), r.arrival_s))
        spreads = self._burst(draft, waiting, prio)
        # NOTE: the others keep their places: one held for a device still comes before the
        # later ones that might take that device
        waiting = in_burst_order(waiting, list(spreads), lambda r: r.rid)
        held: set[str] = set()  # devices a request waits for (`step_first`)
        for i, r in enumerate(waiting):
            if not draft.is_waiting(r):
                continue  # packed into an earlier request's plan
            if all(d in held or prefilling(draft, d, prio) for d in draft.view.devices):
                # NOTE: every device has a prefill of this class (or a higher one) in flight,
                # or waits for a decode step to carry one: a plan issued now would only queue
                # behind it, so the requests wait and are packed into one batch when a plan
                # ends (a round follows each end)
                break
            placed = self._still_held(draft, r) or draft.attempt(
                [r.rid], partial(self._place, draft, r, waiting[i + 1:], held,
                                 spreads.get(r.rid)))
            if isinstance(placed, str):
                held.add(placed)  # NOTE: later requests whose best is elsewhere go on
                self._held_next[r.rid] = (_in_flight(draft.view), placed)
                draft.hold_back()
            elif placed is False:
                draft.hold_back()
                break  # NOTE: nothing fits now; later arrivals of this class wait behind it

    def _still_held(self, draft: Draft, r: RequestView) -> str | None:
        """The device `r` waited for last round, when the same plans are still in flight and
        this round has issued nothing yet: ops of those plans ended since (each end is a
        round), but none of the plans did, so the wait stands and its candidates are not
        simulated again (a held request would otherwise cost a round's worth of
        simulations at every op of the decode step it waits for)."""
        memo = self._held.get(r.rid)
        if memo is None or draft.decision.plans or memo[0] != _in_flight(draft.view):
            return None
        return memo[1]

    def _burst(self, draft: Draft, waiting: list[RequestView], prio: Priority
               ) -> dict[str, Spread]:
        """The burst's order and spreads (`burst_schedule`), for waiting requests of `prio`
        with deadlines while two devices or more have no prefill of the class: their prefill
        seconds on one device and over two are predicted by simulation (each request
        alone), on those devices. Empty (the deadline order, each at its best) for fewer
        than two such requests."""
        free = [d for d in draft.view.devices if not prefilling(draft, d, prio)]
        if len(free) < 2:
            return {}  # NOTE: one device free: the deadline order, packed as before
        # NOTE: a request held for a device last round keeps its wait (`_still_held`)
        burst = [r for r in waiting if r.ttft_deadline is not None
                 and self._still_held(draft, r) is None][:MAX_BURST]
        if len(burst) < 2:
            return {}
        now, jobs = draft.view.now, []
        for r in burst:
            one, two = self._best(draft, r, Spread.ONE), self._best(draft, r, Spread.SPLIT)
            if one is None:
                return {}  # NOTE: out of memory on every device alone: as before
            assert r.ttft_deadline is not None
            jobs.append(BurstJob(r.rid, r.ttft_deadline - now, max(0.0, one.score[1] - now),
                                 None if two is None else max(0.0, two.score[1] - now)))
        # NOTE: the list schedule starts on the devices with no prefill of the class (a
        # device running one frees later than the burst's own prefills can tell)
        return dict(burst_schedule(jobs, len(free)).order)

    def _place(self, draft: Draft, r: RequestView, later: list[RequestView],
               held: set[str], spread: Spread | None = None) -> bool | str:
        """Admit `r` and issue its best candidate, with `later` waiting requests of its class
        packed into its batch where that keeps deadlines (`_pack`); preempt lower classes for
        KV if needed. False when nothing fits; a device, when the best candidate waits for a
        decode step there (`step_first`) or uses a device in `held` (which one waits for:
        `r` may join that plan next round). `spread`: the burst's choice for `r` (`_burst`),
        its best candidate of that spread where one fits."""
        best = (self._best(draft, r, spread) if spread is not None else None) or self._best(
            draft, r)
        if best is None and any(preempt_for(draft, d, r) for d in draft.view.devices):
            best = self._best(draft, r)
        if best is None:
            return False
        log_choice(draft, r, best)
        placement = best.plan.placement
        if waits := held.intersection(best.plan.devices):
            return min(waits)
        if step_first(draft, r, best.plan):
            return placement[0]
        plan, mates = self._pack(draft, r, best, later)
        for q in (r, *mates):
            draft.admit(q, plan.placement)
        draft.issue(self._ride(draft, plan, best, [r, *mates]))
        return True

    def _pack(self, draft: Draft, r: RequestView, best: Scored,
              later: list[RequestView]) -> tuple[Plan, list[RequestView]]:
        """`best` with whole prompts of `later` requests added to its one batch, when it runs
        on one device and every other device has a prefill of its class in flight (so they
        would wait anyway): the longest such pack whose simulation keeps `r`'s score and
        every packed request's deadline. A batch of several prompts costs far less than
        their prefills one after another (the weights are read once per operator)."""
        plan = best.plan
        placement, prio = plan.placement, r.priority
        device = placement[0]
        if (len(set(placement)) != 1 or len(plan.chunks) != 1 or not later or plan.wide
                or not all(prefilling(draft, d, prio) for d in draft.view.devices
                           if d != device)):
            return plan, []
        feeds, mates = list(plan.chunks[0]), []
        budget = draft.view.cfg.max_batch_tokens
        used = sum(f.num_tokens for f in feeds)
        room = draft.room(device, r.model) - draft.admission_blocks(r, placement)
        for q in later:
            at = draft.on(q, placement)
            feed = prefill_feed(at, budget)
            need = draft.admission_blocks(q, placement)
            if (not draft.is_waiting(q) or used + feed.num_tokens > budget or need > room
                    or feed.num_tokens < at.num_tokens - at.num_computed
                    or not draft.view.may_place(q, placement)  # another model's device
                    or draft.view.pool(device, q.model) != draft.view.pool(device, r.model)):
                break  # NOTE: only whole prompts join; the rest wait in their order
            feeds.append(feed)
            mates.append(q)
            used, room = used + feed.num_tokens, room - need
        while mates:
            trial = grown_plan(draft, Plan(prio, placement, [feeds[:len(mates) + 1]]), best,
                               [r, *mates])
            if trial is not None:
                return trial, mates
            mates.pop()
        return plan, []

    def _ride(self, draft: Draft, plan: Plan, best: Scored,
              members: list[RequestView]) -> Plan:
        """`plan` (prompts on one device) with the next decode step of each request of its
        class decoding there in its batch, where the simulation says the batch keeps `best`'s
        score and its members' deadlines: their tokens come with the same weight reads
        instead of a step of their own after it."""
        placement = plan.placement
        if len(set(placement)) != 1 or len(plan.chunks) != 1:
            return plan
        fed = set(plan.rids)  # NOTE: a one-token prompt is no prefill, yet it is fed already
        riders = [q for q in draft.runnable() if q.placement == placement and q.rid not in fed
                  and q.priority == plan.priority and not q.is_prefilling]
        riders = [q for q in riders[:draft.view.cfg.max_decode_seqs]
                  if draft.grow(q, q.num_tokens)]
        if not riders:
            return plan
        feeds = [*plan.chunks[0], *(Feed(q, q.num_computed, 1) for q in riders)]
        grown = Plan(plan.priority, placement, [feeds], wide=plan.wide)
        return grown_plan(draft, grown, best, members) or plan

    def _best(self, draft: Draft, r: RequestView, spread: Spread | None = None
              ) -> Scored | None:
        """The feasible candidate with the best (deadlines missed, cost) score: its own
        deadline, and those of requests placed before it that it alone would make miss
        (ops overlapping on devices that share a host slow each other down); the cost is
        its first token plus the delay it adds to the next tokens of requests decoding on
        its devices (`decode_delay`).

        NOTE: the lowest cost wins, split or not: a split pins the request's KV (and so its
        decode steps) to both devices, but an interactive request's first token is what its
        tenant waits for. Expected: the simulation's prediction scaled by how far plans of
        its kind missed theirs lately (`expected`). `spread`: only candidates on one device
        (`Spread.ONE`) or over several (`Spread.SPLIT`).
        """
        best: Scored | None = None
        for ladder in self._candidates(draft, r):
            last: Scored | None = None
            for placement, chunks in ladder:
                if spread is not None and (len(set(placement)) > 1) != (spread is Spread.SPLIT):
                    break  # NOTE: a ladder keeps its placement
                if not draft.can_admit(r, placement):
                    break
                scored = score(draft, r, placement, chunks)
                if scored is None:
                    continue  # NOTE: out of memory; smaller chunks may fit
                if last is not None and scored.reach >= last.reach:
                    break  # NOTE: more chunks than the last count gained nothing: no more
                last = scored
                if best is None or scored.score < best.score:
                    best = scored
        if spread is Spread.ONE:
            return best  # NOTE: a wide plan occupies two devices, as a split does
        missed, first = (0, None) if best is None else (best.score[0], best.first)
        for placement, chunks, partner in wide_candidates(draft, r, missed, first):
            scored = score(draft, r, placement, chunks, partner)
            if scored is not None and (best is None or scored.score < best.score):
                best = scored
        return best

    def _candidates(self, draft: Draft, r: RequestView) -> list[Ladder]:
        """Candidates in ladders: a placement unchunked (or a one-device one alone), then as
        a pipeline of more and more chunks; `_best` climbs a ladder only while each rung
        misses fewer deadlines or brings the expected first token earlier than the one below
        (a pipeline of 4 chunks is simulated only where 2 beat the whole prompt at once: the
        heaviest simulations of a round).

        NOTE: the climb ignores `decode_delay`: a pipeline of 2 chunks may hold the decoding
        requests a little longer than the whole prompt split once, and its first token still
        comes earlier; one of 4 then keeps a deadline that neither keeps (measured: the
        338-402-token prompts of the saturating recipe's first minute, alone)."""
        view = draft.view
        budget, n = view.cfg.max_batch_tokens, view.num_ops
        # NOTE: on a device holding a cached prefix the plan feeds only the rest of the prompt
        # (after the cached context), so the simulation weighs the hit against that device's
        # load: the longest cached prefix wins unless its device is busier by more.
        composed = placements(view, draft.load)
        out: list[Ladder] = [[(p, batches(draft.on(r, p), budget))] for p in composed]
        todo = min(budget, r.num_tokens - r.num_computed)
        if len(view.devices) < 2 or todo < MIN_PIPELINE_TOKENS or r.cached:
            # NOTE: a cached prefix serves only a placement on the one device holding it
            # (every layer's KV there), so a request with one is not split: a split would
            # recompute the prefix, and its own blocks would become reusable only later
            return out
        # NOTE: with operator replicas, a placement over several devices pays off as a
        # chunked pipeline: a chunk's later operators overlap the next chunk's earlier ones
        for ladder in out:
            if len(set(ladder[0][0])) > 1:
                ladder += pipelines(r, ladder[0][0], budget)
        a, b = sorted(view.devices, key=lambda d: (draft.load(d), d))[:2]
        at = 1 + (n - 2) // 2  # embed + first half of the layer groups
        for first, second in ((a, b), (b, a)):
            placement = split(first, second, at, n)
            if not view.allows(placement):
                continue  # NOTE: with replicas, `placements` composes the splits they allow
            # NOTE: a prompt longer than a batch is fed whole: after a plan of its first
            # batch the rest waits for the low ops that start in the gap (see `batches`)
            whole = r.num_tokens - r.num_computed > budget
            out.append([*([] if whole else [(placement, [[prefill_feed(r, budget)]])]),
                        *pipelines(r, placement, budget)])
        return out

    # -- decode ------------------------------------------------------------------------------
    def _migrate(self, draft: Draft, r: RequestView) -> None:
        """Gather a split request's KV onto its least-loaded device when the simulation says
        it pays: a decode step there (plus the copy, once) against one over the split,
        for each token it may still generate; always with the prefix cache on."""
        assert r.placement is not None
        remaining = r.max_tokens - r.num_output
        whole = set(r.placement) & set(draft.view.full_holders())
        if remaining < 1 or not whole:
            return
        target = min(whole, key=lambda d: (draft.load(d), d))
        split_s = self._step_s(draft, r, r.placement)
        single_s = self._step_s(draft, r, single(target, draft.view.num_ops))
        away = sum(d != target for d in r.placement[1:-1]) / max(1, len(r.placement) - 2)
        nbytes = int(r.blocks_held(target) * draft.view.block_bytes(r.model) * away)
        src = next(d for d in r.placement if d != target)
        copy_s = draft.view.builder.xfer_time(src, target, nbytes)
        # NOTE: with the prefix cache, gathering also makes its blocks reusable (a prefix
        # is cached only where one device holds every layer of it), so it always pays
        if draft.view.cfg.prefix_caching or (split_s - single_s) * remaining > copy_s:
            draft.migrate(r, target)

    def _step_s(self, draft: Draft, r: RequestView, placement: Placement) -> float:
        """Predicted seconds until a decode step of `r` alone on `placement` ends."""
        plan = draft.view.builder.build(Plan(r.priority, placement,
                                             [[Feed(r, r.num_computed, 1)]]))
        return draft.simulate(plan).finish[plan.finals[-1].op_id] - draft.view.now

    def _decode(self, draft: Draft, plan: Plan) -> None:
        draft.view.builder.build(plan)
        if plan.priority < Priority.LOW or harmless(draft, plan):
            draft.issue(plan)
        else:
            draft.hold_back()

    # -- low ---------------------------------------------------------------------------------


def _in_flight(view: RoundView) -> object:
    """The plans in flight, as far as a wait for one of them depends on: the requests in
    them and which devices run a decode step or a prefill of each class."""
    return (frozenset(q.rid for q in view.running), view.decode_inflight,
            frozenset(view.prefill_inflight.items()))
