"""build_engine: the model, devices and executors a config asks for."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from executors.executor import Executor
from gateway.config import ConfigError, load_config
from gateway.engine import build_engine
from scheduler.core.execution import cpu_threads
from scheduler.scheduler import Scheduler


@pytest.mark.parametrize("threads", [None, 1])
def test_cpu_threads_reach_the_executors_and_the_profile(tiny_model_dir: Path,
                                                        threads: int | None) -> None:
    config = load_config(None, {"model.spec": str(tiny_model_dir), "model.dtype": "float32",
                                "scheduler.devices": "cpu:0", "scheduler.cpu_threads": threads})
    sched = build_engine(config).scheduler
    assert isinstance(sched, Scheduler) and sched.estimator is not None
    want = threads or cpu_threads(1)  # default: the cores split between the CPU devices
    assert asyncio.run(_executor_threads(sched)) == [want]
    assert sched.estimator.meta["threads"] == want  # profiled as the executors run
    assert sched.profiler is not None and sched.profiler.threads == want


async def _executor_threads(sched: Scheduler) -> list[int]:
    await sched.start()
    try:
        return [e._threads for e in sched.exec.executors.values() if isinstance(e, Executor)]
    finally:
        await sched.stop()


@pytest.mark.parametrize("bad", [0, -1, True, "two", 1.5])
def test_cpu_threads_must_be_a_positive_integer(bad: object) -> None:
    with pytest.raises(ConfigError, match="scheduler.cpu_threads"):
        load_config(None, {"scheduler.cpu_threads": bad})
