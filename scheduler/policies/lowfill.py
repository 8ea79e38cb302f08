"""`slice`'s low-priority prefills: packed into one plan per device of at most as many
tokens as keep one layer group well inside the tightest SLO, each issued only if the
simulation predicts that no request with a TTFT deadline misses it because of that batch.
"""

from __future__ import annotations

from functools import partial

from executors.types import Priority
from models.batch import BatchShape
from models.template import OpKind
from scheduler.policies.common import fair_order, placed, prefill_feed
from scheduler.policies.pace import tightest_tpot_s
from scheduler.policies.scoring import harmless, prefilling
from scheduler.round.draft import Draft
from scheduler.round.plan import Feed, Plan
from scheduler.round.requestview import Placement, RequestView

# NOTE: a paced request's next step waits for the one low op running on its device when it
# is issued (its own ops then go first), so that op and the step must fit in its TPOT SLO;
# a third of it leaves the step, alone at most half the SLO for a 2x target, room to spare.
# Smaller ops cost more hand-offs, so the bound holds only once a paced request was seen.
TPOT_OP_FRACTION = 1 / 3


def fill_low(draft: Draft) -> None:
    """Low-priority prefills into the gaps: one plan per device without one, unless urgent
    requests wait for memory (see the module docstring)."""
    if any(draft.num_waiting(p) and not all(prefilling(draft, d, p) for d in
                                            draft.view.devices)
           for p in (Priority.HIGH, Priority.NORMAL)):
        # NOTE: urgent requests wait for memory; do not let low work take it (those that
        # wait only for a prefill of their class to end leave low work the gaps)
        return
    going = sorted((r for r in draft.runnable()
                    if r.priority == Priority.LOW and r.is_prefilling),
                   key=lambda r: r.arrival_s)
    if not going and not draft.num_waiting(Priority.LOW):
        return
    for d in sorted(draft.view.devices, key=lambda d: (draft.load(d), d)):
        if not draft.prefills(d, Priority.LOW):
            mine = [r for r in going if r.placement and r.placement[0] == d]
            _fill_low(draft, d, mine)


def _fill_low(draft: Draft, device: str, going: list[RequestView]) -> None:
    """One low-priority prefill plan on `device`, packed up to the chunk budget.

    Its requests' unfinished prompts first, then waiting requests whose KV fits. The
    plan is issued only if harmless; if the packed plan is not, its first feed alone.
    With variant chains (models/variants.py), one such plan per granularity, each packed
    to its own budget, tried by predicted tokens per second (`_rate`): where the bound on
    one op is loose, coarse ops carry as many tokens with fewer hand-offs; where it is
    tight (an interactive step is due soon), fine ops carry more tokens within it.
    """
    placement = going[0].placement if going else placed(draft.view, draft.load, device)
    if placement is None or placement[0] != device:
        return  # NOTE: no replica of the first operator here; its holder fills itself
    going = [r for r in going if r.placement == placement]
    past = max((r.num_computed for r in going), default=0)
    options = []
    for size in _group_sizes(draft):
        feeds, newcomers = _pack(draft, placement, going,
                                 _lp_budget(draft, device, past, size))
        if feeds:
            options.append((size, feeds, newcomers))
    if len(options) > 1:
        options.sort(key=lambda o: -_rate(draft, placement, o[1], o[0]))
    for size, feeds, newcomers in options:
        for trial in ([feeds, feeds[:1]] if len(feeds) > 1 else [feeds]):
            try_it = partial(_try_low, draft, placement, trial, newcomers, size)
            if draft.attempt([f.rid for f in trial], try_it):
                return
    if options:
        draft.hold_back()


def _group_sizes(draft: Draft) -> tuple[int | None, ...]:
    """The granularities a low plan may run at, coarsest first (None: the model's own)."""
    template = draft.view.builder.template
    return (None, *template.group_sizes[1:]) if template.variants else (None,)


def _rate(draft: Draft, placement: Placement, feeds: list[Feed],
          group_size: int | None) -> float:
    """Prompt tokens per second of a low plan run alone: its tokens over the estimates of
    its ops (a plan of one device runs them one after another)."""
    plan = draft.view.builder.build(Plan(Priority.LOW, placement, [feeds],
                                         group_size=group_size))
    return plan.num_tokens() / max(1e-9, sum(op.est_s for op in plan.ops))


def _pack(draft: Draft, placement: Placement, going: list[RequestView],
          budget: int) -> tuple[list[Feed], set[str]]:
    """Feeds of at most `budget` tokens: `going`'s prompts, then waiting requests whose KV
    fits (those admitted by the plan: the second set)."""
    feeds: list[Feed] = []
    used, blocks = 0, 0
    newcomers: set[str] = set()
    for r in going:
        if used >= budget:
            break
        feeds.append(prefill_feed(r, budget - used))
        used += feeds[-1].num_tokens
    for r in fair_order(draft.waiting(Priority.LOW),
                        draft.view.service.get(Priority.LOW, {})):
        if not draft.view.may_place(r, placement):
            continue  # NOTE: another model's device (a server of several models)
        need = draft.admission_blocks(r, placement)
        if used >= budget or blocks + need > min(draft.room(d, r.model)
                                                 for d in set(placement)):
            break
        blocks += need
        newcomers.add(r.rid)
        feeds.append(prefill_feed(draft.on(r, placement), budget - used))
        used += feeds[-1].num_tokens
    return feeds, newcomers


def _try_low(draft: Draft, placement: Placement, feeds: list[Feed],
             newcomers: set[str], group_size: int | None = None) -> bool:
    plan = Plan(Priority.LOW, placement, [feeds], group_size=group_size)
    plan = draft.view.builder.build(plan)
    if not harmless(draft, plan):
        return False
    for f in feeds:
        if f.rid in newcomers:
            draft.admit(f.req, plan.placement)
    draft.issue(plan)
    return True


def _lp_budget(draft: Draft, device: str, past: int, group_size: int | None = None) -> int:
    """Most prefill tokens in one low-priority plan: its slowest layer group must stay
    within a fraction of the tightest SLO (a high-priority op waits at most that), and
    within `TPOT_OP_FRACTION` of the tightest TPOT SLO seen (`pace.tightest_tpot_s`).
    `group_size`: the granularity the plan runs at (None: the model's own)."""
    view = draft.view
    bound = view.cfg.lp_op_slo_fraction * _tightest_slo(draft)
    if (tpot := tightest_tpot_s(draft)) is not None:
        bound = min(bound, TPOT_OP_FRACTION * tpot)
    group = next(t.name for t in view.builder.template.chain("", group_size)
                 if t.kind is OpKind.LAYERS)
    lo, hi = view.cfg.min_lp_chunk_tokens, view.cfg.max_batch_tokens
    while lo < hi:
        mid = (lo + hi + 1) // 2
        shape = BatchShape(mid, 1, 1, mid * (past + mid), past + mid)
        if view.builder.op_time(device, group, shape) <= bound:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _tightest_slo(draft: Draft) -> float:
    slos = [r.ttft_slo_s for r in draft.runnable() if r.ttft_slo_s is not None]
    slos += [r.ttft_slo_s for p in (Priority.HIGH, Priority.NORMAL)
             for r in draft.waiting(p) if r.ttft_slo_s is not None]
    slos.append(draft.view.tightest_slo_s)
    return min(slos)
