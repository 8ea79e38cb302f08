"""The robust windowed refit: it ignores outliers, follows a step change within a window,
and forgets a busy period once newer observations come in."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.cost import linear
from scheduler.cost.estimators import Estimators
from scheduler.cost.features import op_features
from tests.scheduler.cost.test_estimators import TRUE_LAYERS, _shapes, _time

OP = "layers[0:5]"


def _fitted(seed: int = 0) -> Estimators:
    rng = random.Random(seed)
    shapes = _shapes(60, seed=seed)
    est = Estimators({"cpu:0": "cpu"})
    est.fit_op("cpu", OP, shapes, [_time(s, TRUE_LAYERS, rng) for s in shapes])
    return est


def _error(est: Estimators, coef: tuple[float, ...], seed: int = 99) -> float:
    """Worst relative error of the estimator against `coef` over fresh shapes."""
    probes = _shapes(50, seed=seed)
    return max(abs(est.op_time("cpu:0", OP, s) / _time(s, coef, random.Random(), 0) - 1)
               for s in probes)


def _with_outliers(seed: int) -> Estimators:
    rng = random.Random(seed)
    est = _fitted()
    for k, s in enumerate(_shapes(400, seed=seed + 1)):
        t = _time(s, TRUE_LAYERS, rng, noise=0.02)
        if k % 8 == 3:
            t *= rng.choice([4.0, 10.0, 0.2])  # a GC pause, a preempted thread, a bad clock
        est.observe_op("cpu:0", OP, s, t, at=float(k))
    return est


@pytest.mark.parametrize("seed", range(3))
def test_outliers_are_ignored(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    est = _with_outliers(seed)
    assert _error(est, TRUE_LAYERS) < 0.03
    assert est.ops[("cpu", OP)].level == pytest.approx(1.0, abs=0.02)
    monkeypatch.setattr(linear, "TUKEY_C", 1e9)  # every observation weighs the same
    assert _error(_with_outliers(seed), TRUE_LAYERS) > 0.2


def test_a_step_change_is_tracked_within_a_window() -> None:
    rng = random.Random(5)
    est = _fitted()
    slower = tuple(1.4 * c for c in TRUE_LAYERS)
    shapes = _shapes(200, seed=6)
    for k, s in enumerate(shapes[:64]):
        est.observe_op("cpu:0", OP, s, _time(s, slower, rng, noise=0.02), at=float(k))
    assert _error(est, slower) < 0.04
    for k, s in enumerate(shapes[64:]):  # and back
        est.observe_op("cpu:0", OP, s, _time(s, TRUE_LAYERS, rng, noise=0.02), at=100.0 + k)
    assert _error(est, TRUE_LAYERS) < 0.04


def test_a_busy_period_is_forgotten_once_new_observations_come_in() -> None:
    rng = random.Random(7)
    est = _fitted()
    busy = tuple(1.5 * c for c in TRUE_LAYERS)
    shapes = _shapes(100, seed=8)
    for k, s in enumerate(shapes[:40]):  # 40 busy ops over 20 s
        est.observe_op("cpu:0", OP, s, _time(s, busy, rng), at=0.5 * k)
    assert _error(est, busy) < 0.05
    # minutes later, on idle devices: the first refit drops the busy period (too old)
    for k, s in enumerate(shapes[40:56]):
        est.observe_op("cpu:0", OP, s, _time(s, TRUE_LAYERS, rng), at=300.0 + k)
    assert _error(est, TRUE_LAYERS) < 0.02
    assert est.ops[("cpu", OP)].level == pytest.approx(1.0, abs=0.01)


def test_a_window_of_one_shape_keeps_the_profiled_slopes() -> None:
    rng = random.Random(9)
    est = _fitted()
    decode = _shapes(200, seed=10)[1]
    for k in range(64):  # only one shape, 10% slower: its level moves, the slopes stay
        est.observe_op("cpu:0", OP, decode, 1.1 * _time(decode, TRUE_LAYERS, rng), at=float(k))
    assert est.op_time("cpu:0", OP, decode) == pytest.approx(
        1.1 * _time(decode, TRUE_LAYERS, rng, 0), rel=0.01)
    assert _error(est, tuple(1.1 * c for c in TRUE_LAYERS)) < 0.03
    assert op_features(decode)  # (a real shape)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=-1e6, max_value=1e6), min_size=1, max_size=80))
def test_the_refits_median_is_numpys(xs: list[float]) -> None:
    x = np.array(xs)
    assert linear._median(x) == float(np.median(x))
    assert x.tolist() == xs  # NOTE: partitioned in a copy, not in place


def test_solve_drops_negative_features_and_matches_a_direct_solve() -> None:
    rng = np.random.default_rng(0)
    a = rng.uniform(0.1, 1.0, size=(64, 4))
    w, weight, prior = rng.uniform(0.5, 1.0, 64), 1e-3 * np.eye(4), np.zeros(4)
    direct = np.linalg.solve(a.T @ (a * w[:, None]) + weight, a.T @ w)
    assert (direct >= 0).all()
    assert linear._solve(a, w, weight, prior) == pytest.approx(direct, rel=1e-12)
    a[:, 2] = -a[:, 2]  # a feature that only lowers the time: its coefficient would be < 0
    theta = linear._solve(a, w, weight, prior)
    assert theta[2] == 0.0 and (theta >= 0).all()
    rest = [0, 1, 3]
    sub = a[:, rest]
    kept = np.linalg.solve(sub.T @ (sub * w[:, None]) + weight[np.ix_(rest, rest)], sub.T @ w)
    assert theta[rest] == pytest.approx(kept, rel=1e-12)
