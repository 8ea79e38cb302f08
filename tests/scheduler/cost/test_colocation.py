"""Co-location profiling: the pairwise slowdowns are recovered from fake executors given an
injected slowdown, and measured for every pair on the real operators of the tiny model."""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from executors.fake import VirtualCluster
from executors.interference import OP_CLASSES, Interference, op_class
from executors.types import Device, OpInstance, OpRole, OpState, Priority
from models.loader import load
from scheduler.cost.colocation import measure, profile_colocation
from tests.scheduler.helpers import SHAPE

SOLO_S = {"embed": 0.001, "layers": 0.02, "head": 0.008, "send": 0.0005}
NAMES = {"embed": "embed", "layers": "layers[0:5]", "head": "head", "send": "send"}
INJECTED = {("layers", "layers"): 1.3, ("layers", "head"): 1.1, ("head", "layers"): 1.25,
            ("embed", "layers"): 1.6, ("send", "layers"): 2.0, ("layers", "send"): 1.05}


class FakeCoRun:
    """Victims: a chain embed, two layer groups, head, send on cpu:0; background: cpu:1
    runs ops of one class back to back. The cluster applies the injected slowdown."""

    def __init__(self, inter: Interference, jitter: float = 0.0) -> None:
        self.cluster = VirtualCluster(interference=inter)
        self.cluster.add(Device("cpu:0", 1 << 30), lambda op: None)
        self.cluster.add(Device("cpu:1", 1 << 30), self._next_background)
        self.ids = itertools.count()
        self.bg: str | None = None
        self.jitter, self.rounds = jitter, 0

    def _op(self, name: str, device: str, deps: tuple[OpInstance, ...] = ()) -> OpInstance:
        cls = op_class(name)
        assert cls is not None
        wobble = 1 + self.jitter * math.sin(7.1 * self.rounds + len(name))  # deterministic noise
        return OpInstance(next(self.ids), name, OpRole.COMPUTE, 0, device, Priority.LOW, SHAPE,
                          ("r",), deps=deps, est_s=SOLO_S[cls] * wobble)

    def victims(self) -> dict[str, float]:
        self.rounds += 1
        chain: list[OpInstance] = []
        for name in ("embed", "layers[0:5]", "layers[5:10]", "head", "send"):
            chain.append(self._op(name, "cpu:0", (chain[-1],) if chain else ()))
        self.cluster.executors["cpu:0"].enqueue_many(chain)
        while chain[-1].state is not OpState.DONE:
            self.cluster.step()
        out: dict[str, float] = defaultdict(float)
        for op in chain:
            assert op.start is not None and op.end is not None
            out[op_class(op.name) or ""] += op.end - op.start
        return out

    def _next_background(self, op: OpInstance | None) -> None:
        if self.bg is not None:
            self.cluster.executors["cpu:1"].enqueue(self._op(NAMES[self.bg], "cpu:1"))

    @contextmanager
    def background(self, cls: str) -> Iterator[None]:
        self.bg = cls
        self._next_background(None)
        yield
        self.bg = None
        while self.cluster.executors["cpu:1"].running is not None:
            self.cluster.step()


def test_slowdowns_are_recovered_from_fake_executors_with_an_injected_slowdown() -> None:
    inter = Interference({"cpu:0": "h", "cpu:1": "h"}, INJECTED)
    got = measure(FakeCoRun(inter, jitter=0.01), repeats=5)
    assert set(got) == {(a, b) for a in OP_CLASSES for b in OP_CLASSES}
    for (a, b), factor in got.items():
        assert factor == pytest.approx(INJECTED.get((a, b), 1.0), rel=0.02), (a, b)


def test_devices_on_different_hosts_do_not_slow_each_other() -> None:
    inter = Interference({"cpu:0": "h", "cpu:1": "other"}, INJECTED)
    got = measure(FakeCoRun(inter), repeats=2)
    assert all(f == pytest.approx(1.0) for f in got.values())


def test_every_pair_is_measured_on_the_tiny_models_operators(tiny_model_dir: Path) -> None:
    model = load(tiny_model_dir, dtype="float32", layers_per_group=2)
    got = profile_colocation(model, Device("cpu:0", 1).torch_device, repeats=1)
    assert set(got) == {(a, b) for a in OP_CLASSES for b in OP_CLASSES}
    # NOTE: the factors themselves are timings of a shared machine: only their form is checked
    assert all(math.isfinite(f) and f > 0 for f in got.values()), got
