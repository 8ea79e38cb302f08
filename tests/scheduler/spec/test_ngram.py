"""Prompt-lookup drafting (pure)."""

from __future__ import annotations

import random

from scheduler.spec.ngram import propose


def _reference(ids: list[int], k: int, lo: int, hi: int) -> list[int]:
    """A plain scan: the largest n whose suffix occurs earlier, its earliest occurrence."""
    for n in range(min(hi, len(ids) - 1), lo - 1, -1):
        suffix = ids[-n:]
        for start in range(len(ids) - n):
            if ids[start:start + n] == suffix:
                return ids[start + n:start + n + k]
    return []


def test_the_longest_suffix_match_wins_and_its_earliest_occurrence() -> None:
    ids = [1, 2, 3, 9, 5, 2, 3, 8, 1, 2, 3]
    assert propose(ids, 2, 1, 3) == [9, 5]  # [1, 2, 3] matches at 0 (not [2, 3] at 5)
    assert propose(ids, 2, 1, 2) == [9, 5]  # [2, 3] earliest at 1
    assert propose([4, 5, 6, 4], 3, 1, 3) == [5, 6, 4]
    assert propose([4, 5, 6, 7], 3, 1, 3) == []  # no suffix occurs earlier
    assert propose([4, 5, 6, 4], 3, 2, 3) == []  # and none of length >= 2


def test_proposals_stop_at_the_end_and_respect_k() -> None:
    assert propose([1, 2, 1], 5, 1, 1) == [2, 1]  # only what follows exists
    assert propose([1, 2, 1], 0, 1, 1) == []
    assert propose([1], 3, 1, 2) == []


def test_equals_a_plain_scan_on_random_inputs() -> None:
    rng = random.Random(0)
    for _ in range(300):
        ids = [rng.randrange(6) for _ in range(rng.randint(1, 60))]
        lo = rng.randint(1, 3)
        hi = rng.randint(lo, 5)
        k = rng.randint(1, 6)
        assert propose(ids, k, lo, hi) == _reference(ids, k, lo, hi), (ids, k, lo, hi)
