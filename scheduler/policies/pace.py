"""The TPOT guard: a plan of a lower class is issued only where the simulation predicts that
every decoding request of a higher class with an inter-token target (`tpot_slo_s`) keeps
the deadline of its next token.

A paced request has a decode step in flight (or issued this round), or none yet. Its next
step after that one is not in the GMG when a low plan is weighed, yet it is what a low op
issued now delays: the step is issued when the one in flight ends, and on each device it
waits for the low op running there. So each paced request adds a *pending step* to the
simulation: the ops of a one-token step on its placement, at its class, depending on the
last op of its plan in flight (ready when that ends). Deadlines checked:

- the step in flight (or issued): its last op ends by `next_token_deadline(now)`;
- the pending step: it ends within `tpot_slo_s` of the step before it
  (or by `next_token_deadline(now)` when it is the only one).

A plan is vetoed when it makes a deadline miss that the same simulation without it keeps.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from executors.types import Priority
from scheduler.round.draft import Draft
from scheduler.round.plan import Feed, Plan, sim_ops
from scheduler.round.requestview import Placement, RequestView
from scheduler.sim.gmg import SimOp
from scheduler.sim.types import Prediction

ISSUE_S = 5e-4  # a round's time from an op's end to the issue of the next step (`_issue_op`)


@dataclass(frozen=True, slots=True)
class Due:
    """One decode deadline to check: op `op_id` ends by `deadline_s`, or, when `after` is
    set, within `slo_s` of op `after`'s end."""

    rid: str
    op_id: int
    deadline_s: float | None
    after: int | None = None
    slo_s: float = 0.0

    def missed(self, pred: Prediction, now: float) -> bool:
        end = pred.finish.get(self.op_id)
        if end is None:
            return False
        if self.after is None:
            assert self.deadline_s is not None
            return end > self.deadline_s
        return end > pred.finish.get(self.after, now) + self.slo_s


def paced(draft: Draft, plan: Plan) -> list[RequestView]:
    """Decoding requests of a class above `plan`'s with a TPOT SLO, not in `plan`."""
    mine = set(plan.rids)
    seen: dict[str, RequestView] = {}
    for r in (*draft.view.running, *draft.view.runnable, *draft.runnable()):
        if (r.is_paced and r.priority < plan.priority and r.rid not in mine
                and r.rid not in draft.preempted and r.placement is not None):
            seen[r.rid] = r  # NOTE: the draft's view (last) wins: it may have migrated
    return list(seen.values())


def pending_steps(draft: Draft, requests: list[RequestView]) -> tuple[tuple[SimOp, ...],
                                                                       list[Due]]:
    """The pending steps of paced requests as simulator ops, and the deadlines to check.

    NOTE: paced requests of one class on one placement decode in one step of their own
    (`decode_plans`), so their pending steps are one batch: one token of each, at their
    class, after the last ops of the plans they are in. It is issued (dispatch order)
    now, which among ops of its class puts it before later batches, as its real issue
    would when the step before it ends."""
    groups: dict[tuple[Placement, Priority], list[RequestView]] = defaultdict(list)
    for r in requests:
        assert r.placement is not None
        groups[r.placement, r.priority].append(r)
    ops: list[SimOp] = []
    dues: list[Due] = []
    for (placement, prio), members in groups.items():
        more, mine = _group(draft, members)
        dues += mine
        if more:
            ops += _pending(draft, placement, prio, more, len(ops), dues)
    return tuple(ops), dues


def _group(draft: Draft, members: list[RequestView]) -> tuple[list[RequestView], list[Due]]:
    """Of one group: those that decode again after the step they are in (or wait for), and
    the deadline of each one's step in flight."""
    now = draft.view.now
    more: list[RequestView] = []
    dues: list[Due] = []
    for r in members:
        end = draft.step_end(r.rid)
        if end is not None:
            dues.append(Due(r.rid, end, r.next_token_deadline(now)))
        if r.num_output + (end is not None) < r.max_tokens:
            more.append(r)  # NOTE: a step in flight that yields its last token ends it
    return more, dues


def _pending(draft: Draft, placement: Placement, prio: Priority, members: list[RequestView],
             slot: int, dues: list[Due]) -> list[SimOp]:
    """The pending step of `members` (one batch) after a round's `issue` op; adds the
    deadline of each one's token in it to `dues`."""
    now = draft.view.now
    step = draft.view.builder.build(Plan(prio, placement,
                                         [[Feed(r, r.num_tokens, 1) for r in members]]))
    mine = list(sim_ops(step, now))
    last = step.finals[-1].op_id
    ends = {r.rid: draft.step_end(r.rid) for r in members}
    after = tuple(sorted({e for e in ends.values() if e is not None}))
    gap = _issue_op(step.ops[0].op_id, slot, after, now)
    mine[0] = mine[0]._replace(deps=(*mine[0].deps, gap.op_id))
    for r in members:
        end = ends[r.rid]
        assert r.tpot_slo_s is not None
        dues.append(Due(r.rid, last, r.next_token_deadline(now)) if end is None
                    else Due(r.rid, last, None, end, r.tpot_slo_s))
    return [gap, *mine]


def _issue_op(first: int, slot: int, after: tuple[int, ...], now: float) -> SimOp:
    """The round between the end of a paced request's step (`after`; none: now) and the
    issue of its next one.

    NOTE: a device that ends an op starts its next ready op at once, while the next step is
    issued only by the round that handles the end: a low op ready there starts first and
    the step waits for it. A step ready at the very end of the one before would win the
    device by its class in the simulation and hide that wait, so the pending step follows
    an op of `ISSUE_S` on a device of its own (no device runs it; it only delays; `slot`
    numbers the pending steps of one check, so a few names serve every round)."""
    return SimOp(-1 - first, "issue", f"~issue:{slot}", Priority.HIGH, after, ISSUE_S, now,
                 None, 0, (), now)


def keeps_pace(draft: Draft, plan: Plan) -> bool:
    """Whether `plan` (built) breaks no decode deadline of a paced request of a higher class
    that the simulation without it keeps (see the module docstring)."""
    requests = paced(draft, plan)
    if not requests:
        return True
    extra, dues = pending_steps(draft, requests)
    now = draft.view.now
    pred = draft.simulate(plan, extra)
    late = {d for d in dues if d.missed(pred, now)}
    if not late:
        return True
    base = draft.simulate(None, extra)
    return all(d.missed(base, now) for d in late)


def tightest_tpot_s(draft: Draft) -> float | None:
    """The smallest TPOT SLO among requests seen, or None (sizes low chunks).

    NOTE: among requests seen, not only those decoding now: a low plan's ops are queued
    when it is issued, and those of a plan issued before a paced request arrived run one
    per gap of its steps; sized for the pace only once it decodes, its first tokens would
    each wait for a long op."""
    slos = [r.tpot_slo_s for r in (*draft.view.running, *draft.view.runnable)
            if r.tpot_slo_s is not None]
    if draft.view.tightest_tpot_s is not None:
        slos.append(draft.view.tightest_tpot_s)
    return min(slos, default=None)
