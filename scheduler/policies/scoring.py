"""How `slice` scores a candidate plan: deadlines it keeps or breaks, its expected first
token (the simulation's prediction scaled by what plans of its kind measured), and the
delay it adds to requests decoding on its devices; and the checks a grown batch must pass."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass

from executors.types import OpRole, Priority
from scheduler.policies.pace import keeps_pace
from scheduler.round.calibration import kind_of
from scheduler.round.draft import Draft
from scheduler.round.plan import Feed, Plan
from scheduler.round.requestview import Placement, RequestView
from scheduler.sim.types import Prediction

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Scored:
    plan: Plan
    score: tuple[int, float]  # (deadlines missed, expected first token + `decode_delay`)
    first: float  # the expected first token

    @property
    def reach(self) -> tuple[int, float]:
        """(deadlines missed, expected first token): what more chunks of a pipeline buy."""
        return self.score[0], self.first


def score(draft: Draft, r: RequestView, placement: Placement, chunks: list[list[Feed]],
          wide: str | None = None) -> Scored | None:
    """A candidate for `r` built, simulated and scored: (deadlines missed, its own and
    those of requests placed before it that it alone would make miss; expected first token
    + `decode_delay`). None if it runs out of memory. `wide`: a wide plan's partner."""
    plan = draft.view.builder.build(Plan(r.priority, placement, chunks, wide=wide))
    pred = draft.simulate(plan)
    if pred.oom:
        return None
    raw = pred.first_token.get(r.rid, pred.end + rest_s(plan, r))
    first = expected(draft, plan, raw)
    deadline = r.ttft_deadline
    missed = (deadline is not None and first > deadline) + harmed(draft, pred)
    plan.predicted_first_token_s = raw
    return Scored(plan, (missed, first + decode_delay(draft, plan, pred)), first)


def rest_s(plan: Plan, r: RequestView) -> float:
    """Seconds of the prompt `plan` leaves for `r`'s later plans: its compute time per token
    times the tokens left (0 when it feeds the whole prompt).

    NOTE: a candidate that feeds only the first batch of a long prompt ends before one that
    feeds it whole; scored by its end alone it would always win, though the first token
    comes only after the plans that follow it."""
    fed = sum(f.num_tokens for chunk in plan.chunks for f in chunk if f.rid == r.rid)
    left = r.num_tokens - r.num_computed - fed
    if left <= 0 or not fed:
        return 0.0
    compute = sum(op.est_s for op in plan.ops if op.role is OpRole.COMPUTE)
    return compute * left / max(1, plan.num_tokens())


def prefilling(draft: Draft, device: str, prio: Priority) -> bool:
    """Whether a prefill plan of class `prio` or a higher one is in flight on `device`."""
    return any(draft.prefills(device, p) for p in Priority if p <= prio)


def step_first(draft: Draft, r: RequestView, plan: Plan) -> bool:
    """Whether `plan` (prompts on one device) should wait for a decode step of `r`'s class
    in flight on its placement: its ops would run only after that step's anyway (a batch
    of the same class issued earlier goes first), and once the step ends its requests ride
    along in the prefill (`SlicePolicy._ride`) instead of waiting for the whole prefill
    before their next step.

    NOTE: a step runs at its lowest member's class (`decode_plans`). A step carrying `r`'s
    classmates beside lower ones runs at the lower class, and the executors run `plan`'s
    ops ahead of it (and of every other op of that class queued there): waiting for it
    would delay `r`'s first token by whole steps of the lower class, not by one op."""
    placement = plan.placement
    if len(set(placement)) != 1 or len(plan.chunks) != 1:
        return False
    return (placement, r.priority) in draft.view.decode_classes


def decode_delay(draft: Draft, plan: Plan, pred: Prediction) -> float:
    """Seconds `plan` delays the next tokens of requests decoding on its devices (in a step
    or between steps) at its class or a higher one: on each device, until its last op there
    ends (expected, as `expected`), times the requests decoding there. Those on a
    one-device plan's device ride along and get their token at its end; a split holds up
    the requests decoding on every device it uses."""
    now = draft.view.now
    last: dict[str, float] = {}
    for op in plan.ops:
        t = pred.finish.get(op.op_id)
        if t is not None and t > last.get(op.device, now):
            last[op.device] = t
    decoding = Counter(d for q in (*draft.runnable(), *draft.view.running)
                       if q.placement and not q.is_prefilling and q.priority <= plan.priority
                       for d in set(q.placement))
    return sum((expected(draft, plan, t) - now) * decoding[d] for d, t in last.items())


def expected(draft: Draft, plan: Plan, first: float) -> float:
    """A predicted first token `first` of `plan`, its wait scaled by the measured / predicted
    ratio of plans of its placement kind (scheduler/round/calibration.py)."""
    kind = kind_of(plan.placement, len(plan.chunks), plan.wide is not None)
    now = draft.view.now
    return now + (first - now) * draft.view.first_token_factors.get(kind, 1.0)


def grown_plan(draft: Draft, plan: Plan, best: Scored, members: list[RequestView]) -> Plan | None:
    """`plan` (a batch grown from `best`'s, `members` first) built and stamped with its first
    token, if its simulation is not OOM and `keeps` the deadlines; else None."""
    trial = draft.view.builder.build(plan)
    pred = draft.simulate(trial)
    if pred.oom or not keeps(draft, pred, best, members):
        return None
    trial.predicted_first_token_s = pred.first_token.get(members[0].rid, pred.end)
    return trial


def keeps(draft: Draft, pred: Prediction, best: Scored, members: list[RequestView]) -> bool:
    """Whether a packed batch's prediction misses no more deadlines than its first request's
    best plan alone, and keeps every packed request's own deadline (as expected)."""
    r = members[0]
    first = expected(draft, best.plan, pred.first_token.get(r.rid, pred.end))
    missed = (r.ttft_deadline is not None and first > r.ttft_deadline) + harmed(draft, pred)
    if missed > best.score[0]:
        return False
    return all(q.ttft_deadline is None
               or expected(draft, best.plan, pred.first_token.get(q.rid, pred.end))
               <= q.ttft_deadline for q in members[1:])


def harmed(draft: Draft, pred: Prediction) -> int:
    """How many requests with a pending TTFT deadline `pred` misses that the draft as it
    stands (its baseline) keeps."""
    deadlines = draft.snapshot().deadlines
    base: Prediction | None = None
    n = 0
    for rid, deadline in deadlines:
        t = pred.first_token.get(rid)
        if t is None or t <= deadline:
            continue
        if base is None:  # NOTE: the baseline is simulated only once a deadline is missed
            base = draft.baseline()
        before = base.first_token.get(rid)
        if before is not None and before <= deadline:
            n += 1  # this plan alone would make it miss
    return n


def harmless(draft: Draft, plan: Plan) -> bool:
    """True unless the plan would make a request with a TTFT deadline miss it, or a paced
    request of a higher class miss its next decode deadline (`pace.keeps_pace`).

    NOTE: KV pools are reserved whole at start-up and admission is checked against
    them, so the simulated memory that can overflow is activations.
    """
    if draft.snapshot().deadlines:
        pred = draft.simulate(plan)
        if pred.oom or harmed(draft, pred):
            return False
    return keeps_pace(draft, plan)


def log_choice(draft: Draft, r: RequestView, best: Scored) -> None:
    """At DEBUG: `slice`'s best candidate for a waiting request, what it expects and its
    deadline (what a first token past its SLO was placed as). Logged each round the
    request is placed, also when it then waits for a device its candidate uses."""
    if not logger.isEnabledFor(logging.DEBUG):
        return
    now, plan = draft.view.now, best.plan
    logger.debug("%s (%d prompt tokens, waited %.0f ms): %s in %d chunk(s), first token "
                 "expected in %.0f ms, deadline in %s; deadlines missed %d",
                 r.rid, r.num_tokens, 1000 * (now - r.arrival_s), "/".join(dict.fromkeys(
                     plan.placement)) + (f" with {plan.wide}'s cores" if plan.wide else ""),
                 len(plan.chunks), 1000 * (best.first - now),
                 "-" if r.ttft_deadline is None else f"{1000 * (r.ttft_deadline - now):.0f} ms",
                 best.score[0])
