"""`slice`'s candidates for a waiting prompt: its rest in one plan on one device, as a
chunked pipeline over a split, or as a wide plan (`executors.wide`)."""

from __future__ import annotations

from scheduler.policies.common import chunk_feeds, placements, prefill_feed
from scheduler.round.draft import Draft
from scheduler.round.plan import Feed
from scheduler.round.requestview import Placement, RequestView

CHUNK_COUNTS = (2, 4)  # chunked-pipeline candidates
MIN_PIPELINE_TOKENS = 128  # shorter prompts are not worth a split
# NOTE: shorter prompts split too thinly over more threads for the profiled wide factor
# (timed at 384 tokens, scheduler/cost/wide.py) to price them
WIDE_MIN_TOKENS = 256
# NOTE: a wide plan takes two devices' time (about 1.25x one device's on 2 cores) and keeps
# the next arrival off both: it is offered only where the other candidates' first token
# misses the deadline or comes within this share of the SLO before it
WIDE_MARGIN = 0.2


Ladder = list[tuple[Placement, list[list[Feed]]]]  # candidates, each with more chunks


def batches(r: RequestView, budget: int) -> list[list[Feed]]:
    """The rest of `r`'s prompt in one plan: one chunk, or up to `max(CHUNK_COUNTS)` chunks
    of `budget` tokens when it is longer than one batch.

    NOTE: plans of one request run one after another; between two, the device starts a
    low op queued there before the round issues the next, and the prompt waits for it.
    Chunks of one plan on one device follow each other with no such gap."""
    left = r.num_tokens - r.num_computed
    if left <= budget:
        return [[prefill_feed(r, budget)]]
    return chunk_feeds(r, budget, min(max(CHUNK_COUNTS), -(-left // budget)))


def pipelines(r: RequestView, placement: Placement, budget: int) -> Ladder:
    """`placement` as chunked pipelines of the rest of `r`'s prompt, by increasing chunk
    count, each chunk at most `budget` tokens.

    NOTE: a prompt longer than one batch (`max_batch_tokens`) is pipelined whole, not one
    batch at a time: plans of one request run one after another (the next is issued when
    one ends), so a split would leave its first device idle while the second runs the
    first batch's later layers; in one plan, the next chunk's early layers overlap them."""
    left = r.num_tokens - r.num_computed
    out: Ladder = []
    for k in CHUNK_COUNTS:
        todo = min(left, k * budget)
        if todo >= k * MIN_PIPELINE_TOKENS // 2:
            out.append((placement, chunk_feeds(r, -(-todo // k), k)))
    return out


Wide = tuple[Placement, list[list[Feed]], str]  # a wide candidate and its partner device


def wide_candidates(draft: Draft, r: RequestView, missed: int, first: float | None
                    ) -> list[Wide]:
    """Wide candidates for `r` (`executors.wide`), given the best other candidate's deadlines
    `missed` and expected `first` token (None: none fits): the rest of its prompt on one
    device that may admit it, with the least-loaded device lending its cores. None for a
    request without a TTFT deadline, one whose other candidates keep it with room
    (`WIDE_MARGIN`), a prompt shorter than `WIDE_MIN_TOKENS`, or where the profile did not
    time the wide factor."""
    view = draft.view
    builder, budget = view.builder, view.cfg.max_batch_tokens
    if (builder.wide_factor is None or r.num_tokens - r.num_computed < WIDE_MIN_TOKENS
            or r.ttft_deadline is None or r.ttft_slo_s is None):
        return []
    if first is not None and not missed and \
            first <= r.ttft_deadline - WIDE_MARGIN * r.ttft_slo_s:
        return []
    out = []
    for p in placements(view, draft.load):
        lenders = builder.partners.get(p[0], ())
        if len(set(p)) != 1 or not lenders or not draft.can_admit(r, p):
            continue
        partner = min(lenders, key=lambda d: (draft.load(d), d))
        out.append((p, batches(draft.on(r, p), budget), partner))
    return out
