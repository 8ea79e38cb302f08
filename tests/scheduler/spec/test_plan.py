"""Drafts in a decode step (hand-built views): how far each member drafts, the low-class
deferral, and KV for drafts without preempting anyone."""

from __future__ import annotations

import dataclasses

from executors.types import Priority
from scheduler.round.draft import Draft
from scheduler.spec.plan import decode_feeds
from tests.scheduler.views import make_view, req, single

P0 = single("cpu:0")


def _decoding(rid: str, priority: Priority = Priority.NORMAL, rate: float = 0.9,
              draft: tuple[int, ...] = (5, 6, 7, 8)):  # type: ignore[no-untyped-def]
    r = req(rid, priority, prompt=40, max_tokens=64, placement=P0, computed=44, output=5,
            blocks=3)
    return dataclasses.replace(r, draft=draft, accept_rate=rate)


def test_a_member_with_a_likely_draft_verifies_it_and_grows_for_it() -> None:
    a, b = _decoding("a"), _decoding("b", draft=())
    d = Draft(make_view(runnable=[a, b]))
    feeds = decode_feeds(d, [a, b], Priority.NORMAL)
    assert [(f.num_tokens, f.num_draft) for f in feeds] == [(5, 4), (1, 0)]
    assert [(g.rid, g.num_tokens) for g in d.decision.growths] == [("a", 49)]


def test_a_member_whose_drafts_are_rejected_does_not_draft() -> None:
    a = _decoding("a", rate=0.02)
    d = Draft(make_view(runnable=[a]))
    assert [f.num_tokens for f in decode_feeds(d, [a], Priority.NORMAL)] == [1]


def test_a_low_step_does_not_draft_while_a_higher_class_waits() -> None:
    a = _decoding("a", Priority.LOW)
    waiting = req("w", Priority.HIGH)
    d = Draft(make_view(runnable=[a], waiting=[waiting]))
    assert [f.num_tokens for f in decode_feeds(d, [a], Priority.LOW)] == [1]
    d = Draft(make_view(runnable=[a]))
    assert [f.num_tokens for f in decode_feeds(d, [a], Priority.LOW)] == [5]


def test_no_free_blocks_no_drafts() -> None:
    a = _decoding("a")
    d = Draft(make_view(runnable=[a], free_blocks=0))
    assert [f.num_tokens for f in decode_feeds(d, [a], Priority.NORMAL)] == [1]
    assert d.decision.preemptions == []
