"""Co-location slowdowns learnt online: from synthetic ops, and from a run on fake executors
that apply an injected slowdown the profile did not measure."""

from __future__ import annotations

import random

import pytest

from executors.interference import OP_CLASSES, Interference
from scheduler.cost.colearn import CAP, ColocationLearner
from tests.scheduler.cost.test_overlap import HOSTS, SLOWDOWN, _book, _estimators, _run

LAYERS, HEAD = OP_CLASSES.index("layers"), OP_CLASSES.index("head")


def _overlap(**by_class: float) -> tuple[float, ...]:
    return tuple(by_class.get(c, 0.0) for c in OP_CLASSES)


def _feed(learner: ColocationLearner, rng: random.Random, level: float, factor: float,
          n: int = 40, noise: float = 0.0) -> None:
    """Solo layer ops and layer ops overlapped by head ops slowed by `factor`; the
    predictions are off by `level` (measured solo / predicted)."""
    for _ in range(n):
        solo = rng.uniform(0.01, 0.1)
        learner.add(LAYERS, solo * rng.gauss(1, noise), solo / level, _overlap())
        frac = rng.uniform(0.3, 1.0)  # of the solo work done beside a head op
        measured = (solo * (1 - frac) + solo * frac * factor) * rng.gauss(1, noise)
        learner.add(LAYERS, measured, solo / level, _overlap(head=solo * frac * factor))


@pytest.mark.parametrize("level", [0.8, 1.0, 1.25])
def test_a_factor_is_recovered_whatever_the_estimates_level(level: float) -> None:
    learner = ColocationLearner()
    _feed(learner, random.Random(1), level, 1.3)
    assert learner.slowdowns({}) == {("layers", "head"): pytest.approx(1.3)}


def test_noisy_ops_give_the_factor_within_their_noise() -> None:
    learner = ColocationLearner()
    _feed(learner, random.Random(2), 1.0, 1.2, n=64, noise=0.05)
    assert learner.slowdowns({})[("layers", "head")] == pytest.approx(1.2, abs=0.04)


def test_the_other_classes_overlaps_count_at_their_current_factor() -> None:
    learner = ColocationLearner()
    for k in range(10):
        solo = 0.05 + 0.001 * k
        # 0.9 of the solo work beside head (x1.5), 0.1 beside embed (x2.0)
        measured = solo * 0.9 * 1.5 + solo * 0.1 * 2.0
        learner.add(LAYERS, solo, solo, _overlap())
        learner.add(LAYERS, measured, solo, _overlap(head=solo * 0.9 * 1.5,
                                                     embed=solo * 0.1 * 2.0))
    got = learner.slowdowns({("layers", "embed"): 2.0})
    assert got == {("layers", "head"): pytest.approx(1.5)}
    # embed's overlap counted at 1.0 leaves the head's less progress: a larger factor
    assert learner.slowdowns({})[("layers", "head")] > 1.5


def test_ops_that_teach_nothing_are_left_out() -> None:
    learner = ColocationLearner()
    for _ in range(20):
        learner.add(LAYERS, 0.1, 0.1, _overlap())
        learner.add(LAYERS, 0.2, 0.1, _overlap(head=0.01))  # overlapped 5% of its time
        learner.add(LAYERS, 0.2, 0.1, _overlap(head=0.06, embed=0.06))  # no dominant class
        learner.add(-1, 0.2, 0.1, _overlap(head=0.2))  # does not interfere
    assert learner.slowdowns({}) == {} and not learner.due()


def test_too_few_ops_keep_the_profile_and_stalls_are_clamped() -> None:
    learner = ColocationLearner()
    for _ in range(7):
        learner.add(HEAD, 0.1, 0.1, _overlap())
        learner.add(HEAD, 1.0, 0.1, _overlap(layers=1.0))  # far past any factor
    assert learner.slowdowns({}) == {}
    learner.add(HEAD, 0.1, 0.1, _overlap())
    learner.add(HEAD, 1.0, 0.1, _overlap(layers=1.0))
    assert learner.slowdowns({}) == {("head", "layers"): CAP}


def test_factors_below_one_are_clamped_to_none() -> None:
    learner = ColocationLearner()
    _feed(learner, random.Random(3), 1.0, 0.9)
    assert learner.slowdowns({}) == {("layers", "head"): 1.0}


@pytest.mark.parametrize("seed", range(3))
def test_a_run_on_fake_executors_teaches_the_injected_slowdowns(seed: int) -> None:
    """The profile measured nothing (every factor 1.0); the executors slow ops as SLOWDOWN."""
    rng = random.Random(seed)
    est = _estimators(rng, Interference(HOSTS, {}))
    handed: list[Interference] = []
    est.on_interference = handed.append
    _book(est, _run(est, seed), rng)
    assert handed and handed[-1] is est.interference
    learnt = est.interference.slowdown
    assert learnt[("layers", "layers")] == pytest.approx(SLOWDOWN[("layers", "layers")],
                                                         rel=0.02)
    for pair, factor in learnt.items():
        assert factor == pytest.approx(SLOWDOWN.get(pair, 1.0), rel=0.05), pair
    # what it learnt brings the later ops back to their solo times: the online fit ends far
    # closer to the solo one than a fit that never learns a slowdown
    naive = _estimators(random.Random(seed), None)
    _book(naive, _run(naive, seed), random.Random(seed))
    excess = est.ops[("cpu", "layers[0:5]")].level - 1.0
    assert abs(excess) < (naive.ops[("cpu", "layers[0:5]")].level - 1.0) / 2


@pytest.mark.parametrize("switch", ["freeze", "learn_colocation"])
def test_frozen_estimators_or_the_switch_off_learn_no_slowdown(switch: str) -> None:
    rng = random.Random(0)
    est = _estimators(rng, Interference(HOSTS, {}))
    if switch == "freeze":
        est.freeze()
    else:
        est.learn_colocation = False
    _book(est, _run(est, 0), rng)
    assert est.interference is not None and est.interference.slowdown == {}


def test_a_learnt_slowdown_is_logged_at_debug_when_it_moves_a_tenth(
        caplog: pytest.LogCaptureFixture) -> None:
    rng = random.Random(0)
    est = _estimators(rng, Interference(HOSTS, {}))
    with caplog.at_level("DEBUG", logger="scheduler.cost.colearn"):
        _book(est, _run(est, 0), rng)
    records = [r for r in caplog.records if "co-location" in r.getMessage()]
    lines = [r.getMessage() for r in records]
    assert lines and "layers|layers 1.000->1.300" in " ".join(lines)
    assert len(lines) < 5  # not every small change
    assert {r.levelname for r in records} == {"DEBUG"}  # routine: the summary says it at INFO
    summary = est.learning.summary()
    assert summary is not None and f"co-location slowdowns {len(lines)} change(s)" in summary
    assert "estimator refits" in summary


def test_ops_that_waited_for_a_core_teach_no_factor() -> None:
    """Ops that kept their core show a 1.3x neighbour; ops descheduled most of their time
    (other work on the machine: 3x their solo time, a third of it on the CPU) are left out,
    solo or overlapped, so they neither inflate the factor nor the solo level."""
    learner = ColocationLearner()
    rng = random.Random(4)
    _feed(learner, rng, 1.0, 1.3)
    for _ in range(40):
        solo = rng.uniform(0.01, 0.1)
        learner.add(LAYERS, 3 * solo, solo, _overlap(), cpu_s=solo)
        learner.add(LAYERS, 3 * solo * 1.3, solo, _overlap(head=3 * solo * 1.3), cpu_s=solo)
        learner.add(LAYERS, solo * 1.3, solo, _overlap(head=solo * 1.3), cpu_s=solo * 1.2)
    assert learner.slowdowns({}) == {("layers", "head"): pytest.approx(1.3)}
    # the same descheduled ops without their CPU time would move it
    blind = ColocationLearner()
    _feed(blind, random.Random(4), 1.0, 1.3)
    for _ in range(40):
        solo = rng.uniform(0.01, 0.1)
        blind.add(LAYERS, 3 * solo * 1.3, solo, _overlap(head=3 * solo * 1.3))
    assert blind.slowdowns({})[("layers", "head")] > 1.5
