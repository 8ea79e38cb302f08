"""Draft: a round's decisions so far, and the state later decisions must see."""

from __future__ import annotations

import dataclasses

import pytest

from executors.types import Priority
from scheduler.round.draft import Draft
from scheduler.round.plan import Feed, Plan
from tests.scheduler.views import BLOCK_BYTES, make_view, req, single


def test_admission_takes_kv_and_makes_the_request_runnable() -> None:
    a = req("a", prompt=40, max_tokens=8)  # its 40 prompt tokens: 3 blocks of 16
    draft = Draft(make_view(waiting=[a], free_blocks=4))
    admitted = draft.admit(a, single("cpu:0"))
    assert draft.free_blocks("cpu:0") == 1 and draft.free_blocks("cpu:1") == 4
    assert draft.waiting(Priority.LOW) == [] and draft.runnable() == [admitted]
    assert admitted.placement == single("cpu:0") and admitted.kv_blocks == (("cpu:0", 3),)
    assert not draft.can_reserve({"cpu:0"}, 48)
    with pytest.raises(ValueError):
        draft.admit(req("b"), single("cpu:0"))
    assert [a.rid for a in draft.decision.admissions] == ["a"]


def test_preemption_returns_kv_and_puts_the_victim_first_in_line() -> None:
    old = req("old", placement=single("cpu:0"), computed=40, output=1, blocks=3)
    queued = req("q", arrival=1.0)
    draft = Draft(make_view(waiting=[queued], runnable=[old], free_blocks=0))
    draft.preempt(old, "kv for hp")
    assert draft.free_blocks("cpu:0") == 3 and draft.runnable() == []
    first = draft.waiting(Priority.LOW)[0]
    assert first.rid == "old" and first.placement is None and first.num_computed == 0
    assert [(p.rid, p.reason) for p in draft.decision.preemptions] == [("old", "kv for hp")]


def test_an_issued_plan_joins_the_snapshot_and_the_loads() -> None:
    r = req("r", placement=single("cpu:1"), blocks=3)
    draft = Draft(make_view(runnable=[r], now=5.0))
    base = draft.baseline()
    plan = draft.view.builder.build(Plan(Priority.LOW, single("cpu:1"), [[Feed(r, 0, 40)]]))
    draft.issue(plan)
    assert draft.runnable() == [] and draft.load("cpu:1") > 0 == draft.load("cpu:0")
    assert draft.prefills("cpu:1", Priority.LOW) == 1
    ids = {o.op_id for o in draft.snapshot().ops}
    assert {o.op_id for o in plan.ops} <= ids
    assert all(o.issued_at == 5.0 for o in draft.snapshot().ops)
    assert draft.baseline() is not base and draft.baseline().end > 5.0


def test_a_step_that_raises_fails_its_requests_and_the_round_goes_on() -> None:
    a, b = req("a"), req("b", arrival=1.0)
    draft = Draft(make_view(waiting=[a, b]))

    def boom() -> None:
        raise ZeroDivisionError("boom")
    assert draft.attempt(["a"], boom) is None
    assert [r.rid for r in draft.waiting(Priority.LOW)] == ["b"]
    (failure,) = draft.decision.failures
    assert failure.rids == ("a",) and "ZeroDivisionError: boom" in failure.error
    assert "boom" in failure.traceback
    assert draft.attempt(["b"], lambda: 7) == 7


def test_growth_takes_blocks_only_when_the_next_token_needs_one() -> None:
    r = req("r", placement=single("cpu:0"), computed=32, prompt=32, output=1, blocks=2)
    draft = Draft(make_view(runnable=[r], free_blocks=1))
    assert draft.grow(r, 32) and draft.decision.growths == []  # 2 blocks hold 32 tokens
    assert draft.grow(r, 33) and draft.free_blocks("cpu:0") == 0
    assert [(g.rid, g.num_tokens) for g in draft.decision.growths] == [("r", 33)]
    assert draft.runnable()[0].kv_blocks == (("cpu:0", 3),)
    assert not draft.grow(r, 49)


def test_preemption_swaps_while_the_host_has_room_then_recomputes() -> None:
    a = req("a", placement=single("cpu:0"), computed=30, prompt=30, output=1, blocks=2)
    b = req("b", placement=single("cpu:0"), computed=30, prompt=30, output=1, blocks=2,
            arrival=1.0)
    draft = Draft(make_view(runnable=[a, b], host_free_bytes=2 * BLOCK_BYTES))
    draft.preempt(b, "test")
    draft.preempt(a, "test")
    assert [(p.rid, p.swap) for p in draft.decision.preemptions] == [("b", True), ("a", False)]
    first, second = draft.waiting(Priority.LOW)
    assert (first.rid, first.swapped, first.num_computed) == ("a", False, 0)
    assert (second.rid, second.swapped, second.num_computed) == ("b", True, 30)
    back = draft.admit(second, single("cpu:1"))
    assert back.kv_blocks == (("cpu:1", 2),) and not back.swapped  # 31 tokens: 2 blocks


def test_admission_leaves_the_watermark_free() -> None:
    a = req("a", prompt=40)  # 3 blocks
    assert not Draft(make_view(waiting=[a], free_blocks=4, watermark=2)).can_reserve(
        {"cpu:0"}, a.kv_tokens)
    assert Draft(make_view(waiting=[a], free_blocks=5, watermark=2)).can_reserve(
        {"cpu:0"}, a.kv_tokens)


def test_migration_frees_the_blocks_off_the_target() -> None:
    split = ("cpu:0",) * 3 + ("cpu:1",) * 3
    r = req("r", placement=split, computed=40, output=1, blocks=3)
    draft = Draft(make_view(runnable=[r], free_blocks=10))
    moved = draft.migrate(r, "cpu:1")
    assert moved.placement == single("cpu:1") and moved.kv_blocks == (("cpu:1", 3),)
    assert draft.free_blocks("cpu:0") == 13 and draft.free_blocks("cpu:1") == 10
    assert [(m.rid, m.target) for m in draft.decision.migrations] == [("r", "cpu:1")]


def test_preempting_a_request_drops_its_growth_and_undoes_its_admission() -> None:
    grown = req("g", placement=single("cpu:0"), computed=32, prompt=32, output=1, blocks=2)
    new = req("n", prompt=20, arrival=5.0)
    draft = Draft(make_view(waiting=[new], runnable=[grown], free_blocks=10))
    assert draft.grow(grown, 33)
    admitted = draft.admit(new, single("cpu:0"))
    draft.preempt(draft.runnable()[0], "test")
    draft.preempt(admitted, "test")
    d = draft.decision
    assert d.growths == [] and d.admissions == [] and [p.rid for p in d.preemptions] == ["g"]
    assert [r.rid for r in draft.waiting(Priority.LOW)] == ["n", "g"]
    assert draft.free_blocks("cpu:0") == 12  # 10 free + g's 2 held; growth and n undone


def test_a_cached_prefix_is_admitted_for_its_uncached_blocks_and_revived_ones() -> None:
    # 80 prompt tokens (5 blocks); 64 cached on cpu:1, 2 of those 4 blocks held by nobody
    a = dataclasses.replace(req("a", prompt=80), cached=(("cpu:1", 64, 2),))
    draft = Draft(make_view(waiting=[a], free_blocks=10))
    assert draft.on(a, single("cpu:1")).num_computed == 64
    assert draft.on(a, single("cpu:0")).num_computed == 0
    assert draft.admission_blocks(a, single("cpu:0")) == 5
    assert draft.admission_blocks(a, single("cpu:1")) == 1 + 2
    admitted = draft.admit(a, single("cpu:1"))
    assert admitted.num_computed == 64 and admitted.kv_blocks == (("cpu:1", 5),)
    assert draft.free_blocks("cpu:1") == 7
    assert draft.decision.admissions[0].num_cached == 64
    draft.preempt(admitted, "test")  # undone this round: it gives back what it took
    assert draft.free_blocks("cpu:1") == 10 and draft.waiting(Priority.LOW)[0].cached


def test_preempting_a_request_frees_only_the_blocks_nobody_else_holds() -> None:
    old = dataclasses.replace(req("old", placement=single("cpu:0"), computed=40, output=1,
                                  blocks=3), kv_shared=(("cpu:0", 2),))
    draft = Draft(make_view(runnable=[old], free_blocks=0))
    draft.preempt(old, "kv for hp")
    assert draft.free_blocks("cpu:0") == 1
