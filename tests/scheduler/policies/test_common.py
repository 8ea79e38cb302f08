"""Decode steps per placement at the lowest class; preemption only when it makes room."""

from __future__ import annotations

import dataclasses

from executors.types import Priority
from scheduler.policies.common import chunk_feeds, decode_plans, preempt_for
from scheduler.round.draft import Draft
from scheduler.round.requestview import RequestView
from tests.scheduler.views import make_view, req, single


def _decoding(rid: str, prio: Priority, device: str = "cpu:0", arrival: float = 0.0
              ) -> RequestView:
    return req(rid, prio, prompt=10, placement=single(device), computed=10, output=1, blocks=2,
               arrival=arrival)


def test_decode_steps_share_a_placement_at_the_lowest_class() -> None:
    rs = [_decoding("h1", Priority.HIGH), _decoding("l1", Priority.LOW),
          _decoding("l2", Priority.LOW, arrival=1.0), _decoding("n1", Priority.NORMAL),
          _decoding("h2", Priority.HIGH, device="cpu:1")]
    plans = decode_plans(Draft(make_view(runnable=rs)), lambda r: r.priority)
    got = [(p.priority, p.placement[0], p.rids) for p in plans]
    assert got == [(Priority.HIGH, "cpu:1", ("h2",)),
                   (Priority.LOW, "cpu:0", ("h1", "n1", "l1", "l2"))]
    for p in plans:
        assert all(f.num_tokens == 1 and f.past == 10 for f in p.chunks[0])


def test_a_placement_with_a_step_in_flight_waits_for_the_next() -> None:
    rs = [_decoding("h1", Priority.HIGH), _decoding("l1", Priority.LOW, device="cpu:1")]
    view = dataclasses.replace(make_view(runnable=rs),
                               decode_inflight=frozenset({single("cpu:1")}))
    plans = decode_plans(Draft(view), lambda r: r.priority)
    assert [p.rids for p in plans] == [("h1",)]


def test_preemption_takes_the_newest_lower_class_first_and_only_what_is_needed() -> None:
    victims = [req(f"v{i}", Priority.LOW, placement=single("cpu:0"), blocks=3, arrival=float(i),
                   computed=5) for i in range(3)]
    hp = req("hp", Priority.HIGH, prompt=70, max_tokens=20)  # admitted with 70 tokens: 5 blocks
    draft = Draft(make_view(waiting=[hp], runnable=victims, free_blocks=0))
    assert preempt_for(draft, "cpu:0", hp) == 2
    assert [p.rid for p in draft.decision.preemptions] == ["v2", "v1"]
    assert draft.can_reserve({"cpu:0"}, hp.kv_tokens)


def test_no_preemption_when_it_cannot_make_room() -> None:
    victims = [req("v", Priority.LOW, placement=single("cpu:0"), blocks=3, computed=5),
               req("same", Priority.HIGH, placement=single("cpu:0"), blocks=9, computed=5)]
    hp = req("hp", Priority.HIGH, prompt=70, max_tokens=20)  # 5 blocks; 1 free + 3 lower
    draft = Draft(make_view(waiting=[hp], runnable=victims, free_blocks=1))
    assert preempt_for(draft, "cpu:0", hp) == 0 and not draft.decision.preemptions


def test_chunked_pipeline_feeds_cover_the_prompt_in_order() -> None:
    r = req("r", prompt=300, computed=20)
    chunks = chunk_feeds(r, 60, 4)
    spans = [(c[0].past, c[0].num_tokens) for c in chunks]
    assert spans == [(20, 60), (80, 60), (140, 60), (200, 60)]
    assert chunks[-1][0].samples is False and chunk_feeds(r, 70, 4)[-1][0].samples is True


def test_a_full_device_preempts_the_newest_of_the_lowest_class_for_a_decode() -> None:
    rs = [_decoding("h", Priority.HIGH), _decoding("n", Priority.NORMAL, arrival=1.0),
          _decoding("l_old", Priority.LOW, arrival=2.0),
          _decoding("l_new", Priority.LOW, arrival=3.0)]
    rs = [dataclasses.replace(r, num_computed=32, prompt_len=32, kv_blocks=(("cpu:0", 2),))
          for r in rs]  # each needs a third block for its 33rd token
    draft = Draft(make_view(runnable=rs, free_blocks=1))
    plans = decode_plans(draft, lambda r: r.priority)
    # h takes the free block; n preempts l_new, which frees two: one for n, one for l_old
    assert [p.rid for p in draft.decision.preemptions] == ["l_new"]
    assert [p.rids for p in plans] == [("h", "n", "l_old")]
    assert {g.rid for g in draft.decision.growths} == {"h", "n", "l_old"}


def test_a_request_never_takes_blocks_from_a_higher_class() -> None:
    rs = [_decoding("h", Priority.HIGH), _decoding("l", Priority.LOW, arrival=1.0)]
    rs = [dataclasses.replace(r, num_computed=32, prompt_len=32, kv_blocks=(("cpu:0", 2),))
          for r in rs]
    draft = Draft(make_view(runnable=rs, free_blocks=0))
    plans = decode_plans(draft, lambda r: r.priority)
    # h takes l's blocks; l, the lowest and newest, preempts itself rather than h
    assert [p.rid for p in draft.decision.preemptions] == ["l"]
    assert [p.rids for p in plans] == [("h",)]


def test_a_request_that_cannot_grow_gives_its_kv_up_or_waits_for_a_lower_class() -> None:
    h = dataclasses.replace(_decoding("h", Priority.HIGH), num_computed=32, prompt_len=32,
                            kv_blocks=(("cpu:0", 2),))
    low = dataclasses.replace(_decoding("l", Priority.LOW), kv_blocks=(("cpu:0", 5),))
    alone = Draft(make_view(runnable=[h], free_blocks=0))
    assert decode_plans(alone, lambda v: v.priority) == []
    assert [p.rid for p in alone.decision.preemptions] == ["h"] and not alone.decision.blocked
    waits = Draft(make_view(runnable=[h], running=[low], free_blocks=0))
    assert decode_plans(waits, lambda v: v.priority) == []
    assert waits.decision.blocked == ["h"] and not waits.decision.preemptions
