"""A decode step's feeds with drafts: how far each member verifies this step.

`decode_feeds` is what `scheduler.policies.common.decode_plans` calls for each
step it builds. A member with a proposal (`RequestView.draft`, prompt lookup
done by the scheduler when the view was taken) drafts k of its tokens, k from
`scheduler.spec.choice.choose_k` over the step's estimated cost with and
without them. Drafts never preempt anyone: a member drafts only while its
devices have the free blocks for its k extra tokens (`Draft.grow`).
"""

from __future__ import annotations

from executors.types import Priority
from models.batch import BatchShape
from scheduler.round.draft import Draft
from scheduler.round.plan import Feed, shape_of_chunk
from scheduler.round.requestview import RequestView
from scheduler.spec.choice import choose_k, expected_tokens


def decode_feeds(draft: Draft, members: list[RequestView], priority: Priority) -> list[Feed]:
    """One feed per member: its next token, plus the drafts this step verifies."""
    feeds = [Feed(r, r.num_computed, 1) for r in members]
    if not any(r.draft for r in members) or _defers(draft, priority):
        return feeds
    for i, r in enumerate(members):
        if not r.draft:
            continue
        others = sum(expected_tokens(f.req.acceptance, f.num_draft)
                     for j, f in enumerate(feeds) if j != i)

        def cost(k: int, i: int = i, r: RequestView = r) -> float:
            trial = [*feeds[:i], Feed(r, r.num_computed, 1 + k), *feeds[i + 1:]]
            return _step_s(draft, r, shape_of_chunk(trial))

        k = choose_k(r.acceptance, len(r.draft), cost, others)
        if k and draft.grow(r, r.num_tokens + k):
            feeds[i] = Feed(r, r.num_computed, 1 + k)
    return feeds


def _defers(draft: Draft, priority: Priority) -> bool:
    """A low-class step does not draft while higher-class work waits or prefills.

    NOTE: a verify step runs longer than a plain one, and a higher-class prefill queued
    behind it on the same device waits for it; a low request's speed-up is not worth that."""
    if priority is not Priority.LOW:
        return False
    view = draft.view
    return any(view.waiting.get(p) for p in Priority if p < priority) or any(
        r.priority < priority and r.is_prefilling for r in (*view.runnable, *view.running))


def _step_s(draft: Draft, r: RequestView, shape: BatchShape) -> float:
    """The estimated compute time of one step of `shape` on `r`'s placement."""
    builder = draft.view.builder
    placement = r.placement or ()
    return sum(builder.op_time(placement[t.index], t.name, shape)
               for t in builder.template.chain(r.model))
