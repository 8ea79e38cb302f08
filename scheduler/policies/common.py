"""What every policy needs: placements, per-class decode steps, prefill feeds, preemption."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from executors.types import Priority
from scheduler.draft import Draft
from scheduler.plan import Feed, Plan
from scheduler.requestview import Placement, RequestView

PriorityOf = Callable[[RequestView], Priority]


def single(device: str, num_ops: int) -> Placement:
    return (device,) * num_ops


def split(first: str, second: str, at: int, num_ops: int) -> Placement:
    """Ops [0, at) on `first`, the rest on `second`."""
    return (first,) * at + (second,) * (num_ops - at)


def decode_plans(draft: Draft, priority_of: PriorityOf) -> list[Plan]:
    """Decode steps of runnable requests: one batch per (placement, class), most urgent first.

    NOTE: classes never share a step, so a low-priority decode never runs at a higher
    class than its own (a high-priority prefill waits at most one low operator per
    device). A (placement, class) with a step in flight is skipped, so newcomers join
    the next step instead of fragmenting the batch.
    """
    groups: dict[tuple[Placement, Priority], list[RequestView]] = defaultdict(list)
    for r in draft.runnable():
        if r.is_prefilling or r.placement is None:
            continue
        prio = priority_of(r)
        if not draft.decoding(r.placement, prio):
            groups[(r.placement, prio)].append(r)
    plans = []
    size = draft.view.cfg.max_decode_seqs
    for (placement, prio), members in groups.items():
        members.sort(key=lambda r: r.arrival_s)
        for i in range(0, len(members), size):
            feeds = [Feed(r, r.num_computed, 1) for r in members[i:i + size]]
            plans.append(Plan(prio, placement, [feeds]))
    return sorted(plans, key=lambda p: p.priority)


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
    fits there; returns how many. Preempts nobody when even all of them would not do."""
    victims = sorted((v for v in draft.runnable() if v.priority > req.priority
                      and v.placement is not None and device in v.placement),
                     key=lambda v: -v.arrival_s)
    need = draft.blocks_needed(req.kv_tokens)
    held = sum(b for v in victims for d, b in v.kv_blocks if d == device)
    if draft.free_blocks(device) + held < need:
        return 0
    count = 0
    for v in victims:
        if draft.free_blocks(device) >= need:
            break
        draft.preempt(v, f"kv for {req.rid}")
        count += 1
    return count
