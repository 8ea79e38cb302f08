"""Measured times on a shared host are learnt as solo times: run on fake executors that
apply an injected slowdown, fed back in booking batches, they leave the fit where it was."""

from __future__ import annotations

import random

import pytest

from executors.fake import VirtualCluster
from executors.interference import Interference
from executors.types import Device, OpInstance, OpRole, Priority
from scheduler.cost.estimators import Estimators
from tests.scheduler.cost.test_estimators import TRUE_LAYERS, _shapes, _time

COEF = {"embed": (2e-7, 0, 0, 0, 0, 0, 0, 5e-5), "layers[0:5]": TRUE_LAYERS,
        "head": (1e-5, 0, 0, 2e-4, 0, 0, 0, 2e-3)}
SLOWDOWN = {("layers", "layers"): 1.3, ("layers", "head"): 1.1, ("head", "layers"): 1.2,
            ("embed", "layers"): 1.5, ("layers", "embed"): 1.02, ("head", "head"): 1.15}
HOSTS = {"cpu:0": "h", "cpu:1": "h"}


def _estimators(rng: random.Random, inter: Interference | None) -> Estimators:
    est = Estimators({"cpu:0": "cpu", "cpu:1": "cpu"})
    shapes = _shapes(80, seed=1)
    for name, coef in COEF.items():
        est.fit_op("cpu", name, shapes, [_time(s, coef, rng, noise=0) for s in shapes])
    est.set_interference(inter)
    return est


def _run(est: Estimators, seed: int) -> list[OpInstance]:
    """Chains embed -> layers -> head on both devices at once, timed by solo estimates."""
    rng = random.Random(seed)
    cluster = VirtualCluster(interference=Interference(HOSTS, SLOWDOWN))
    done: list[OpInstance] = []
    for d in HOSTS:
        cluster.add(Device(d, 1 << 30), done.append)
    ids = iter(range(10**6))
    for shape in _shapes(120, seed=seed):
        prev: OpInstance | None = None
        dev = f"cpu:{rng.randrange(2)}"
        for name in COEF:
            op = OpInstance(next(ids), name, OpRole.COMPUTE, 0, dev, Priority.LOW,
                            shape, ("r",), deps=(prev,) if prev else ())
            op.est_s = est.estimate(op)
            cluster.executors[dev].enqueue(op)
            prev = op
    cluster.run_until_idle()
    return done


def _book(est: Estimators, done: list[OpInstance], rng: random.Random) -> None:
    """Feed completions back in batches, each reordered across devices (a device's own ops
    stay in completion order, as the scheduler books them)."""
    k = 0
    while k < len(done):
        batch = done[k:k + rng.randint(1, 6)]
        first = rng.choice(list(HOSTS))
        batch.sort(key=lambda op: op.device != first)  # stable: per-device order kept
        for op in batch:
            est.observe(op)
        k += len(batch)


@pytest.mark.parametrize("seed", range(3))
def test_times_measured_beside_other_ops_are_learnt_as_solo_times(seed: int) -> None:
    rng = random.Random(seed)
    est = _estimators(rng, Interference(HOSTS, SLOWDOWN))
    probes = _shapes(40, seed=9)
    before = {n: [est.op_time("cpu:0", n, s) for s in probes] for n in COEF}
    done = _run(est, seed)
    _book(est, done, rng)
    for name, want in before.items():
        assert est.ops[("cpu", name)].level == pytest.approx(1.0, abs=1e-6), name
        assert [est.op_time("cpu:1", name, s) for s in probes] == pytest.approx(want, rel=1e-3)
    assert max(est.mape().values()) < 1e-6
    # without the co-location model, the same timings teach slower estimates
    naive = _estimators(random.Random(seed), None)
    _book(naive, _run(naive, seed), rng)
    assert naive.ops[("cpu", "layers[0:5]")].level > 1.05
