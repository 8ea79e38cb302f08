import math

import pytest

from scheduler.provisioning.queueing import erlang_c, mean_wait_s, min_stable, replicas_for


def erlang_c_by_sums(c: int, a: float) -> float:
    """The textbook closed form, summed term by term (the reference for the recursion)."""
    top = a ** c / math.factorial(c) * c / (c - a)
    return top / (sum(a ** k / math.factorial(k) for k in range(c)) + top)


@pytest.mark.parametrize(("c", "a", "expected"), [
    (1, 0.5, 0.5),  # M/M/1: the probability of waiting is the utilisation
    (2, 1.0, 1 / 3),
    (3, 2.0, 4 / 9),
    (10, 8.0, 0.40918),  # the classic call-centre table value
])
def test_erlang_c_known_values(c: int, a: float, expected: float) -> None:
    assert erlang_c(c, a) == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize("c", [1, 2, 5, 16, 40])
def test_erlang_c_matches_the_closed_form(c: int) -> None:
    for a in (0.1 * c, 0.5 * c, 0.95 * c):
        assert erlang_c(c, a) == pytest.approx(erlang_c_by_sums(c, a), rel=1e-9)


def test_unstable_or_idle_queues() -> None:
    assert erlang_c(2, 2.0) == 1.0 and erlang_c(2, 3.0) == 1.0
    assert erlang_c(3, 0.0) == 0.0
    assert mean_wait_s(2, 2.0, 1.0) == math.inf
    assert mean_wait_s(1, 0.0, 1.0) == 0.0


def test_mm1_mean_wait() -> None:
    # M/M/1: Wq = rho / (mu - lambda); lambda 0.5/s, service 1 s -> 1 s
    assert mean_wait_s(1, 0.5, 1.0) == pytest.approx(1.0)


def test_min_stable_is_the_fewest_servers_under_full_utilisation() -> None:
    assert min_stable(0.0, 1.0) == 1
    assert min_stable(1.5, 1.0) == 2
    assert min_stable(2.0, 1.0) == 3  # exactly 2 servers at 2 Erlangs is not stable
    assert min_stable(10.0, 0.35) == 4


def test_replicas_for_meets_the_wait_budget() -> None:
    lam, s = 30.0, 0.1  # 3 Erlangs
    assert replicas_for(lam, s, math.inf, 64) == 4
    c = replicas_for(lam, s, 0.005, 64)
    assert mean_wait_s(c, lam, s) <= 0.005 < mean_wait_s(c - 1, lam, s)
    assert replicas_for(lam, s, 0.0, 8) == 8  # nothing meets a zero budget: the cap
    assert replicas_for(1000.0, 1.0, 1.0, 8) == 8
