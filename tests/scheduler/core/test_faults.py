"""`--fault-rate`: injected operator faults, and that every request still ends cleanly."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest

from executors.types import Device, OpRole, Priority
from scheduler.api import FinishReason
from scheduler.core.faults import InjectedFault, faulty
from tests.scheduler.cluster import ClusterRun


def test_faulty_fails_about_rate_of_compute_ops_only() -> None:
    made: dict[str, Any] = {}

    def factory(device: Device, run_op: Any, on_done: Any, loop: Any) -> Any:
        made["run"] = run_op
        return None

    faulty(factory, 0.1, seed=1)(Device("cpu:0", 1 << 20), lambda op: "ok", print, None)
    run = made["run"]
    outcomes = []
    for _ in range(2000):
        try:
            outcomes.append(run(SimpleNamespace(role=OpRole.COMPUTE, name="layers0")))
        except InjectedFault:
            outcomes.append(None)
    assert 150 < outcomes.count(None) < 250
    assert all(run(SimpleNamespace(role=OpRole.RECV, name="recv")) == "ok" for _ in range(200))
    with pytest.raises(ValueError):
        faulty(factory, 1.5)


async def test_with_faults_every_request_completes_or_ends_with_an_error() -> None:
    rng = random.Random(7)

    def fault(op: Any) -> Exception | None:
        return InjectedFault("injected") if rng.random() < 0.05 else None

    async with ClusterRun("slice", fault=fault) as run:
        outs = [run.submit(f"r{i}", list(Priority)[i % 3], 40 + 7 * i, max_tokens=6,
                           tenant=f"t{i % 4}") for i in range(40)]
        await run.run_out()
    assert all(o.finish is FinishReason.LENGTH or (o.finish is FinishReason.ERROR and o.error)
               for o in outs)
    assert any(o.finish is FinishReason.LENGTH for o in outs)
    assert run.sched.kv.usage() == 0 and not run.sched.states
