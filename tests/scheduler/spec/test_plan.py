"""Drafts in a decode step (hand-built views): how far each member drafts, the low-class
deferral, and KV for drafts without preempting anyone."""

from __future__ import annotations

import dataclasses

import pytest

from executors.types import Priority
from models.modelset import model_set
from scheduler.round.draft import Draft
from scheduler.round.plan import Builder, Feed, shape_of_chunk
from scheduler.spec.plan import _step_s, decode_feeds
from tests.scheduler.cluster import weightless
from tests.scheduler.conftest import linear_time, xfer_time
from tests.scheduler.views import make_view, req, single

P0 = single("cpu:0")


def _decoding(rid: str, priority: Priority = Priority.NORMAL, rate: float = 0.9,
              draft: tuple[int, ...] = (5, 6, 7, 8)):  # type: ignore[no-untyped-def]
    r = req(rid, priority, prompt=40, max_tokens=64, placement=P0, computed=44, output=5,
            blocks=3)
    return dataclasses.replace(r, draft=draft, acceptance=(rate, rate))


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


def test_a_step_in_a_model_set_is_priced_over_its_own_models_chain() -> None:
    # the set lays chat's and batch's chains end to end; a batch request's step runs batch's
    # ops only, so it costs what the same step of that model alone costs
    s = model_set([("chat", weightless(), None), ("batch", weightless(), None)])
    alone = _decoding("a")
    one = Draft(make_view(runnable=[alone]))
    r = dataclasses.replace(alone, model="batch", placement=("cpu:0",) * len(s.template.ops))
    view = make_view(runnable=[r])
    both = Draft(dataclasses.replace(view, num_ops=len(s.template.ops), builder=Builder(
        s.template, view.cfg.block_size, linear_time, xfer_time)))
    shape = shape_of_chunk([Feed(r, r.num_computed, 5)])
    assert _step_s(both, r, shape) == pytest.approx(_step_s(one, alone, shape))
