"""How far to draft (pure): expected tokens, the choice of k, the acceptance estimate."""

from __future__ import annotations

import pytest

from scheduler.spec.choice import (
    PRIOR_ACCEPT,
    Acceptance,
    SpecCounters,
    choose_k,
    expected_tokens,
)


def test_expected_tokens() -> None:
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)


def _cost(per_token: float):  # type: ignore[no-untyped-def]
    return lambda k: 1.0 + per_token * (k + 1)


def test_drafts_far_when_drafts_are_accepted_and_verifying_is_cheap() -> None:
    assert choose_k(0.95, 8, _cost(0.01)) == 8


def test_does_not_draft_when_acceptance_is_low() -> None:
    assert choose_k(0.05, 8, _cost(0.1)) == 0


def test_does_not_draft_when_a_verify_costs_as_much_as_the_tokens_it_brings() -> None:
    assert choose_k(0.9, 8, lambda k: float(k + 1)) == 0  # compute-bound: no gain
    assert choose_k(0.6, 8, _cost(1.0)) == 1  # at most a short draft


def test_a_batch_dilutes_the_gain() -> None:
    alone = choose_k(0.6, 4, _cost(0.1))
    assert alone > 0
    assert choose_k(0.6, 4, _cost(0.1), others=30.0) == 0


def test_no_room_no_draft() -> None:
    assert choose_k(0.9, 0, _cost(0.0)) == 0


def test_acceptance_follows_what_verify_steps_saw_and_recovers_when_idle() -> None:
    a = Acceptance()
    for _ in range(20):
        a.observe(4, 0)
    assert a.rate < 0.01
    for _ in range(100):
        a.idle()
    assert a.rate == pytest.approx(PRIOR_ACCEPT, abs=0.01)
    a.observe(4, 4)
    assert a.rate > PRIOR_ACCEPT
    a.observe(0, 0)  # nothing drafted: nothing learnt


def test_acceptance_is_the_geometric_estimate_accepted_over_trials() -> None:
    # drafts are tried until the first rejection: 3 of 5 accepted is 3 successes and one
    # failure (3 / 4), not 3 of 5; the two never tried after the rejection do not count
    a = Acceptance()
    for _ in range(60):
        a.observe(5, 3)
    assert a.rate == pytest.approx(0.75, abs=0.01)
    for _ in range(60):
        a.observe(5, 5)  # all accepted: no failure seen
    assert a.rate == pytest.approx(1.0, abs=0.01)


def test_counters_count_acceptance_per_position() -> None:
    c = SpecCounters()
    c.record(4, 2)
    c.record(2, 2)
    c.record(3, 0)
    assert (c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens) == (3, 9, 4)
    assert c.accepted_per_pos == [2, 2, 0, 0]
