"""`scheduler.spec.steps`: the runs a verify step emitted, and its acceptance booked."""

from __future__ import annotations

import torch

from models.logprobs import HeadOutput
from models.spec_config import SpecConfig
from scheduler.api import SchedulerStats, SpecDecodeCounts
from scheduler.round.plan import Feed
from scheduler.spec.choice import SpecCounters
from scheduler.spec.state import SpecState
from scheduler.spec.steps import book_run, verify_runs, with_counters
from tests.scheduler.views import req, single


def _feed(rid: str, num_draft: int) -> Feed:
    """A decode step of `rid` (8 prompt tokens, 1 output) feeding `num_draft` drafts."""
    r = req(rid, prompt=8, computed=8, output=1, placement=single("cpu:0"))
    return Feed(r, 8, 1 + num_draft)


def test_verify_runs_names_the_drafted_feeds_runs_only() -> None:
    chunk = [_feed("a", 2), _feed("b", 0), _feed("c", 1)]
    runs = [[5, 6, 7], [9], [4]]
    out = HeadOutput(torch.tensor([7, 9, 4]), [None] * 3, runs=runs)
    assert verify_runs(chunk, out) == {"a": [5, 6, 7], "c": [4]}
    assert verify_runs(chunk, torch.tensor([7, 9, 4])) == {}  # no verify step: no runs


def test_book_run_counts_the_accepted_drafts_and_ends_those_in_flight() -> None:
    spec = SpecState(SpecConfig(num_speculative_tokens=3, prompt_lookup_max=3))
    spec.in_flight = [5, 6, 8]
    counters, (first, nxt) = SpecCounters(), spec.acceptance.rates
    book_run(spec, counters, [5, 6, 9])  # two drafts accepted, then the corrected token
    assert (counters.num_drafts, counters.num_draft_tokens, counters.num_accepted_tokens) \
        == (1, 3, 2)
    assert counters.accepted_per_pos == [1, 1, 0] and spec.in_flight == []
    # the first draft was accepted; past it, 1 of 2 trials (6 accepted, 8 rejected)
    assert spec.acceptance.first > first
    assert abs(spec.acceptance.next - 1 / 2) < abs(nxt - 1 / 2)


def test_a_runs_model_books_it_apart_and_every_model_is_reported() -> None:
    spec = SpecState(SpecConfig(num_speculative_tokens=3, prompt_lookup_max=3))
    counters = SpecCounters()
    spec.in_flight = [5, 6, 8]
    book_run(spec, counters, [5, 6, 9], model="small")  # two of three accepted
    spec.in_flight = [4]
    book_run(spec, counters, [7])  # no model named: the total only
    assert (counters.num_drafts, counters.num_draft_tokens) == (2, 4)
    small = counters.by_model["small"]
    assert (small.num_drafts, small.num_draft_tokens, small.num_accepted_tokens) == (1, 3, 2)
    assert set(counters.by_model) == {"small"}
    stats = with_counters(SchedulerStats(), counters, ["chat", "small"])
    assert stats.spec_decode == {"chat": SpecDecodeCounts(),
                                 "small": SpecDecodeCounts(1, 3, 2, (1, 1, 0))}
