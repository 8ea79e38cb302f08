"""What every policy needs: placements, per-class decode steps, prefill feeds, preemption,
and the fair order of a class's waiting requests."""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Mapping

from executors.types import Priority
from scheduler.round.draft import Draft
from scheduler.round.plan import Feed, Plan
from scheduler.round.requestview import Placement, RequestView
from scheduler.round.view import RoundView
from scheduler.spec.plan import decode_feeds

PriorityOf = Callable[[RequestView], Priority]


def single(device: str, num_ops: int) -> Placement:
    return (device,) * num_ops


def split(first: str, second: str, at: int, num_ops: int) -> Placement:
    """Ops [0, at) on `first`, the rest on `second`."""
    return (first,) * at + (second,) * (num_ops - at)


def placed(view: RoundView, load: Callable[[str], float], prefer: str) -> Placement:
    """A placement around `prefer`: each operator runs there if `prefer` holds a replica of
    it, else on the device of the operator before it if that one does (no transfer), else
    on its least-loaded holder. Without replicas (every device holds every operator) it is
    `single(prefer)`, and so it is with several models (a request of a model set runs on
    one device holding its model's chain: `RoundView.may_place`)."""
    if view.holders is None or view.model_devices:
        return single(prefer, view.num_ops)
    out: list[str] = []
    prev = prefer
    for holders in view.holders:
        if prefer in holders:
            prev = prefer
        elif prev not in holders:
            prev = min(holders, key=lambda d: (load(d), d))
        out.append(prev)
    return tuple(out)


def placements(view: RoundView, load: Callable[[str], float]) -> list[Placement]:
    """One placement per device that holds the first operator or anything at all, distinct."""
    seen: dict[Placement, None] = {}
    for d in view.devices:
        seen.setdefault(placed(view, load, d), None)
    return list(seen)


def decode_plans(draft: Draft, priority_of: PriorityOf) -> list[Plan]:
    """Decode steps of runnable requests: one batch per placement, at its lowest member's class.

    Each member first grows its KV to hold its next token (`make_room` preempts for it when
    a device is full). NOTE: a decode step costs mostly its weight reads (`benchmarks.models chain`:
    a step of 8 sequences takes about 1.5x one of 1), so the classes of a placement share
    one step rather than paying for one step each. The step runs at the class of its lowest
    member, so a low-priority decode never runs at a higher class than its own and a
    high-priority prefill waits for at most one of its operators per device; the price is
    that a high-priority request decoding beside low ones decodes at their pace. A
    placement with a step in flight is skipped, so newcomers join the next step instead of
    fragmenting it. Members with a prompt-lookup proposal may verify drafts in the step
    (`scheduler.spec.plan.decode_feeds`).
    """
    ready = sorted((r for r in draft.runnable() if not r.is_prefilling and r.placement
                    and not _stepping(draft, r)),
                   key=lambda r: (priority_of(r), r.arrival_s))
    groups: dict[tuple[Placement, Priority | None], list[RequestView]] = defaultdict(list)
    for r in ready:
        if draft.is_runnable(r.rid) and make_room(draft, r, r.num_tokens):
            assert r.placement is not None
            groups[r.placement, _paced_class(r)].append(r)
    plans = []
    size = draft.view.cfg.max_decode_seqs
    for (placement, _), members in groups.items():
        members = [r for r in members if draft.is_runnable(r.rid)]  # not preempted since
        for i in range(0, len(members), size):
            part = members[i:i + size]
            priority = max(priority_of(r) for r in part)
            plans.append(Plan(priority, placement, [decode_feeds(draft, part, priority)]))
    return sorted(plans, key=lambda p: p.priority)


def _paced_class(r: RequestView) -> Priority | None:
    """The class whose own step `r` decodes in: its own with a TPOT SLO, else None (the
    shared step of its placement).

    NOTE: a request with a TPOT SLO never decodes in a step of a lower class: such a step
    runs at that class and waits behind every low op issued before it on each device, so
    its pace would be the low work's. Its own step costs one more weight read per token;
    the TPOT guard (policies/pace.py) keeps low ops out of its way."""
    return r.priority if r.tpot_slo_s is not None else None


def _stepping(draft: Draft, r: RequestView) -> bool:
    """Whether a step that `r` would have joined is in flight on its placement (a paced
    request: a step of its class there; any other: any step there)."""
    assert r.placement is not None
    if _paced_class(r) is None:
        return draft.decoding(r.placement)
    return (r.placement, r.priority) in draft.view.decode_classes


def make_room(draft: Draft, req: RequestView, num_tokens: int) -> bool:
    """Grow `req`'s KV to `num_tokens`, preempting runnable requests of its class or lower on
    its devices (lowest class, then newest, first) until the blocks are there.

    When `req` itself is next in that order it gives its KV up, unless a lower class holds
    blocks on its devices in a plan in flight: then it waits (blocked) for those to become
    runnable and be preempted for it, as a higher class never yields to a lower one.
    False when `req` was preempted or waits."""
    devices = set(req.placement or ())
    while not draft.grow(req, num_tokens):
        victims = [v for v in draft.runnable() if v.priority >= req.priority
                   and devices & set(v.placement or ())]
        victim = max(victims, key=lambda v: (v.priority, v.arrival_s))
        if victim.rid == req.rid and any(v.priority > req.priority
                                         and devices & set(v.placement or ())
                                         for v in draft.view.running):
            draft.block(req)
            return False
        draft.preempt(victim, f"kv for {req.rid}")
        if victim.rid == req.rid:
            return False
    return True


def issue_plan(draft: Draft, plan: Plan) -> None:
    """Build `plan`'s ops and add it to the draft; if that raises, its requests fail."""
    draft.attempt(plan.rids, lambda: draft.issue(draft.view.builder.build(plan)))


def prefill_feed(req: RequestView, max_tokens: int) -> Feed:
    """The next chunk of what is not in KV yet, at most `max_tokens`."""
    return Feed(req, req.num_computed, min(max_tokens, req.num_tokens - req.num_computed))


def chunk_feeds(req: RequestView, chunk_tokens: int, num_chunks: int) -> list[list[Feed]]:
    """A prefill cut into `num_chunks` consecutive chunks (a chunked pipeline)."""
    todo = min(chunk_tokens * num_chunks, req.num_tokens - req.num_computed)
    size = -(-todo // num_chunks)
    return [[Feed(req, req.num_computed + i, min(size, todo - i))]
            for i in range(0, todo, size)]


def preempt_for(draft: Draft, device: str, req: RequestView) -> int:
    """Preempt runnable requests of a lower class on `device` (newest first) until `req`'s KV
    fits there; returns how many. Preempts nobody when even all of them would not do, or
    where `req`'s model does not run (a server of several models)."""
    if not draft.view.may_place(req, single(device, draft.view.num_ops)):
        return 0
    pool = draft.view.pool(device, req.model)
    # NOTE: only requests whose KV is in `req`'s pool free blocks it can use
    victims = sorted((v for v in draft.runnable() if v.priority > req.priority
                      and v.placement is not None and device in v.placement
                      and draft.view.pool(device, v.model) == pool),
                     key=lambda v: -v.arrival_s)
    need = draft.admission_blocks(req, single(device, draft.view.num_ops)) + \
        draft.view.kv_watermark_blocks.get(pool, 0)
    held = sum(v.blocks_freed(device) for v in victims)
    if draft.free_blocks(device, req.model) + held < need:
        return 0
    count = 0
    for v in victims:
        if draft.free_blocks(device, req.model) >= need:
            break
        draft.preempt(v, f"kv for {req.rid}")
        count += 1
    return count


def fair_order(waiting: list[RequestView], service: Mapping[str, float]) -> list[RequestView]:
    """Waiting requests of one class, tenant by tenant in the order of their virtual token
    counters (`service`: tenant -> tokens served, scheduler/core/fairness.py), each tenant's own
    in arrival order; a request taken charges its prompt to its tenant for the rest of the
    order, so one round does not hand the whole class to the least-served tenant."""
    by_tenant: dict[str, deque[RequestView]] = defaultdict(deque)
    for r in sorted(waiting, key=lambda r: r.arrival_s):
        by_tenant[r.tenant].append(r)
    counters = {t: service.get(t, 0.0) for t in by_tenant}
    out: list[RequestView] = []
    while by_tenant:
        tenant = min(by_tenant, key=lambda t: (counters[t], by_tenant[t][0].arrival_s))
        r = by_tenant[tenant].popleft()
        out.append(r)
        counters[tenant] += r.prompt_len
        if not by_tenant[tenant]:
            del by_tenant[tenant]
    return out
