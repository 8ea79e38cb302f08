"""`slice`: the full design. Placements chosen by what-if simulation of the GMG.

Each round: high-priority prefills by earliest TTFT deadline (then normal),
each placed on the candidate partition (one device, a layer split over two,
or a chunked pipeline over that split) with the earliest predicted first
token; then decode steps; then low-priority prefills, packed into one plan
per device of at most as many tokens as keep one layer group well inside the
tightest SLO, each issued only if the simulation predicts that no request
with a TTFT deadline misses it because of that batch. OOM candidates are discarded, never tried.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from executors.types import Priority
from models.batch import BatchShape
from scheduler.batching import (
    RoundContext,
    chunk_feeds,
    decode_plans,
    kv_tokens,
    prefill_feed,
    single,
    split,
)
from scheduler.gmg import Snapshot
from scheduler.plan import Feed, Plan, to_candidate
from scheduler.policy import preempt_for
from scheduler.simulator import Candidate, Prediction, simulate
from scheduler.state import Placement, RequestState

CHUNK_COUNTS = (2, 4)  # chunked-pipeline candidates
MIN_PIPELINE_TOKENS = 128  # shorter prompts are not worth a split


@dataclass(slots=True)
class Recorder:
    """Benchmark hook: the simulations of each round and the rounds' decision times."""

    calls: list[tuple[int, object, object]]  # (round, snapshot, candidate)
    round_s: list[float]
    round: int = 0


RECORDER: Recorder | None = None  # NOTE: set only by `python -m scheduler bench simulator`


def _simulate(snap: Snapshot, cand: Candidate | None = None) -> Prediction:
    if RECORDER is not None:
        RECORDER.calls.append((RECORDER.round, snap, cand))
    return simulate(snap, cand)


@dataclass(slots=True)
class Scored:
    plan: Plan
    prediction: Prediction
    score: tuple[bool, bool, float]  # (misses its deadline, spans devices, first token time)


class SlicePolicy:
    name = "slice"

    def run_round(self, ctx: RoundContext) -> None:
        t0 = time.perf_counter()
        self._round(ctx)
        if RECORDER is not None:
            RECORDER.round_s.append(time.perf_counter() - t0)
            RECORDER.round += 1

    def _round(self, ctx: RoundContext) -> None:
        for prio in (Priority.HIGH, Priority.NORMAL):
            self._urgent(ctx, prio)
        for plan in decode_plans(ctx, lambda s: s.priority):
            if plan.priority < Priority.LOW or self._harmless(ctx, plan):
                ctx.issue(plan)
        self._low(ctx)

    # -- high / normal -----------------------------------------------------------------------
    def _urgent(self, ctx: RoundContext, prio: Priority) -> None:
        going = [s for s in ctx.runnable if s.priority == prio and s.is_prefilling]
        for s in going:
            assert s.placement is not None
            ctx.issue(Plan(prio, s.placement, [[prefill_feed(s, ctx.cfg.max_batch_tokens)]]))
        waiting = sorted(ctx.waiting.queue(prio),
                         key=lambda s: (s.req.ttft_deadline or float("inf"), s.req.arrival_time))
        for s in waiting:
            best = self._best_placement(ctx, s)
            if best is None:
                break  # NOTE: nothing fits now; later arrivals of this class wait behind it
            ctx.admit(s, best.plan.placement)
            ctx.issue(best.plan)

    def _best_placement(self, ctx: RoundContext, s: RequestState) -> Scored | None:
        """The feasible candidate with the best (misses deadline, spans devices, TTFT) score.

        NOTE: a split placement pins the request's KV, and so its decode steps, to both
        devices, apart from the other requests' batches; it is worth that only when no
        single device would meet the deadline (or when the request has none).
        """
        snap = ctx.snapshot()
        deadline = s.req.ttft_deadline
        best: Scored | None = None
        for placement, chunks in self._candidates(ctx, s):
            if not ctx.kv.can_reserve(set(placement), kv_tokens(s)):
                continue
            plan = ctx.builder.build(Plan(s.priority, placement, chunks), tensors=False)
            pred = _simulate(snap, to_candidate(plan, {}))
            if pred.oom:
                continue
            first = pred.first_token.get(s.rid, pred.end)
            late = deadline is not None and first > deadline
            spans = deadline is not None and len(set(placement)) > 1
            score = (late, spans, first)
            if best is None or score < best.score:
                best = Scored(plan, pred, score)
        if best is None and self._make_room(ctx, s):
            return self._best_placement(ctx, s)
        return best

    def _candidates(self, ctx: RoundContext, s: RequestState
                    ) -> list[tuple[Placement, list[list]]]:
        budget = ctx.cfg.max_batch_tokens
        out: list[tuple[Placement, list[list]]] = [
            (single(d, ctx.num_ops), [[prefill_feed(s, budget)]]) for d in ctx.devices]
        todo = len(s.next_chunk(budget))
        if len(ctx.devices) < 2 or todo < MIN_PIPELINE_TOKENS:
            return out
        a, b = sorted(ctx.devices, key=lambda d: (ctx.load(d), d))[:2]
        at = 1 + (ctx.num_ops - 2) // 2  # embed + first half of the layer groups
        for first, second in ((a, b), (b, a)):
            placement = split(first, second, at, ctx.num_ops)
            out.append((placement, [[prefill_feed(s, budget)]]))
            for n in CHUNK_COUNTS:
                if todo >= n * MIN_PIPELINE_TOKENS // 2:
                    out.append((placement, chunk_feeds(s, -(-todo // n), n)))
        return out

    def _make_room(self, ctx: RoundContext, s: RequestState) -> bool:
        return any(preempt_for(ctx, d, s) for d in ctx.devices)

    # -- low ----------------------------------------------------------------------------------
    def _low(self, ctx: RoundContext) -> None:
        if ctx.waiting.count(Priority.HIGH) or ctx.waiting.count(Priority.NORMAL):
            return  # NOTE: urgent requests wait for memory; do not let low work take it
        going = sorted((s for s in ctx.runnable if s.priority == Priority.LOW and s.is_prefilling),
                       key=lambda s: s.req.arrival_time)
        if not going and not ctx.waiting.count(Priority.LOW):
            return
        for d in sorted(ctx.devices, key=lambda d: (ctx.load(d), d)):
            if not ctx.prefills(d, Priority.LOW):
                self._fill_low(ctx, d, [s for s in going if s.placement and s.placement[0] == d])

    def _fill_low(self, ctx: RoundContext, device: str, going: list[RequestState]) -> None:
        """One low-priority prefill plan on `device`, packed up to the chunk budget.

        Its requests' unfinished prompts first, then waiting requests whose KV fits. The
        plan is issued only if harmless; if the packed plan is not, its first feed alone.
        """
        budget = self._lp_budget(ctx, device, max((s.num_computed for s in going), default=0))
        feeds: list[Feed] = []
        used, blocks = 0, 0
        newcomers: set[str] = set()
        for s in going:
            if used >= budget:
                break
            feeds.append(prefill_feed(s, budget - used))
            used += len(feeds[-1].tokens)
        for s in ctx.waiting.queue(Priority.LOW):
            need = ctx.kv.blocks_needed(device, kv_tokens(s))
            if used >= budget or not ctx.kv.can_allocate(device, blocks + need):
                break
            blocks += need
            newcomers.add(s.rid)
            feeds.append(prefill_feed(s, budget - used))
            used += len(feeds[-1].tokens)
        for trial in ([feeds, feeds[:1]] if len(feeds) > 1 else [feeds]):
            plan = Plan(Priority.LOW, single(device, ctx.num_ops), [trial])
            if trial and self._harmless(ctx, plan):
                for f in trial:
                    if f.state.rid in newcomers:
                        ctx.admit(f.state, plan.placement)
                ctx.issue(plan)
                return

    def _lp_budget(self, ctx: RoundContext, device: str, past: int) -> int:
        """Most prefill tokens in one low-priority plan: its slowest layer group must stay
        within a fraction of the tightest SLO (a high-priority op waits at most that)."""
        bound = ctx.cfg.lp_op_slo_fraction * self._tightest_slo(ctx)
        group = ctx.builder.template.layer_groups[0].name
        lo, hi = ctx.cfg.min_lp_chunk_tokens, ctx.cfg.max_batch_tokens
        while lo < hi:
            mid = (lo + hi + 1) // 2
            shape = BatchShape(mid, 1, 1, mid * (past + mid), past + mid)
            if ctx.builder.op_time(device, group, shape) <= bound:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _tightest_slo(self, ctx: RoundContext) -> float:
        slos = [s.req.ttft_slo_s for s in ctx.runnable if s.req.ttft_slo_s is not None]
        slos += [s.req.ttft_slo_s for p in (Priority.HIGH, Priority.NORMAL)
                 for s in ctx.waiting.queue(p) if s.req.ttft_slo_s is not None]
        slos.append(ctx.tightest_slo_s)
        return min(slos)

    def _harmless(self, ctx: RoundContext, plan: Plan) -> bool:
        """True unless the plan would make a request with a TTFT deadline miss it.

        NOTE: KV pools are reserved whole at start-up and admission is checked against
        them, so the simulated memory that can overflow is activations.
        """
        snap = ctx.snapshot()
        if not snap.deadlines:
            return True
        built = ctx.builder.build(plan, tensors=False)
        base, pred = ctx.baseline(_simulate), _simulate(snap, to_candidate(built, {}))
        if pred.oom:
            return False
        for rid, deadline in snap.deadlines:
            t, before = pred.first_token.get(rid), base.first_token.get(rid)
            if t is not None and t > deadline and before is not None and before <= deadline:
                return False  # this plan alone would make it miss
        return True
