"""How far to draft (pure): expected tokens, the choice of k, the acceptance estimate."""

from __future__ import annotations

import pytest

from scheduler.spec.choice import (
    PRIOR_FIRST,
    PRIOR_NEXT,
    Acceptance,
    SpecCounters,
    choose_k,
    expected_tokens,
)


def test_expected_tokens() -> None:
    assert expected_tokens((0.0, 0.9), 4) == 1.0  # the first draft never accepted
    assert expected_tokens((1.0, 1.0), 4) == 5.0
    assert expected_tokens((0.5, 0.5), 2) == pytest.approx(1.75)  # one rate: geometric
    assert expected_tokens((0.8, 0.5), 2) == pytest.approx(1.0 + 0.8 * 1.5)
    assert expected_tokens((0.8, 0.5), 0) == 1.0


def _cost(per_token: float):  # type: ignore[no-untyped-def]
    return lambda k: 1.0 + per_token * (k + 1)


def test_drafts_far_when_drafts_are_accepted_and_verifying_is_cheap() -> None:
    assert choose_k((0.95, 0.95), 8, _cost(0.01)) == 8


def test_does_not_draft_when_acceptance_is_low() -> None:
    assert choose_k((0.05, 0.05), 8, _cost(0.1)) == 0
    assert choose_k((0.05, 0.95), 8, _cost(0.1)) == 0  # long runs, but seldom a first one


def test_does_not_draft_when_a_verify_costs_as_much_as_the_tokens_it_brings() -> None:
    assert choose_k((0.9, 0.9), 8, lambda k: float(k + 1)) == 0  # compute-bound: no gain
    assert choose_k((0.6, 0.6), 8, _cost(1.0)) == 1  # at most a short draft


def test_runs_that_go_on_once_started_are_drafted_far() -> None:
    # code edits: a step accepts all its drafts or none. At the same chance of a first
    # accepted draft, one rate for every position (the geometric model) stops early;
    # a high `next` (what such traffic shows) drafts as far as the verify stays cheap
    line = _cost(0.11)  # about the estimators' verify line on the bench's CPU
    assert choose_k((0.6, 0.6), 5, line) <= 3
    assert choose_k((0.6, 0.95), 5, line) == 5


def test_a_batch_dilutes_the_gain() -> None:
    alone = choose_k((0.6, 0.6), 4, _cost(0.1))
    assert alone > 0
    assert choose_k((0.6, 0.6), 4, _cost(0.1), others=30.0) == 0


def test_no_room_no_draft() -> None:
    assert choose_k((0.9, 0.9), 0, _cost(0.0)) == 0


def test_acceptance_follows_what_verify_steps_saw_and_recovers_when_idle() -> None:
    a = Acceptance()
    assert a.rates == (PRIOR_FIRST, PRIOR_NEXT)
    for _ in range(20):
        a.observe(4, 0)
    assert a.first < 0.01
    assert a.next == PRIOR_NEXT  # no draft after an accepted one was tried
    for _ in range(100):
        a.idle()
    assert a.first == pytest.approx(PRIOR_FIRST, abs=0.01)
    a.observe(4, 4)
    assert a.first > PRIOR_FIRST and a.next > PRIOR_NEXT
    before = a.rates
    a.observe(0, 0)  # nothing drafted: nothing learnt
    assert a.rates == before


def test_next_is_the_geometric_estimate_past_the_first_draft() -> None:
    # drafts are tried until the first rejection: 3 of 5 accepted is a first success, then
    # 2 successes and one failure (2 / 3); the two never tried after the rejection do not count
    a = Acceptance()
    for _ in range(60):
        a.observe(5, 3)
    assert a.first == pytest.approx(1.0, abs=0.01)
    assert a.next == pytest.approx(2 / 3, abs=0.01)
    for _ in range(60):
        a.observe(5, 5)  # all accepted: no failure seen
    assert a.next == pytest.approx(1.0, abs=0.01)
    for _ in range(60):
        a.observe(5, 1)  # the first accepted, the second rejected
    assert a.next == pytest.approx(0.0, abs=0.01)
    assert a.first == pytest.approx(1.0, abs=0.01)


def test_counters_count_acceptance_per_position() -> None:
    c = SpecCounters()
    c.record(4, 2)
    c.record(2, 2)
    c.record(3, 0)
    assert (c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens) == (3, 9, 4)
    assert c.accepted_per_pos == [2, 2, 0, 0]
