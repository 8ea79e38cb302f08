"""`Scheduler.time_direct`: a request's chain timed on a device's executor thread."""

from __future__ import annotations

import threading

import pytest
import torch

import models
from models import generate as generate_module
from scheduler.api import DirectUnavailable
from tests.scheduler.conftest import make_scheduler


async def test_the_chain_runs_on_the_devices_executor_thread(
        tiny_model: models.Model, monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[str] = []
    real = generate_module.run_chain

    def recording(*args: object) -> torch.Tensor:
        threads.append(threading.current_thread().name)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(generate_module, "run_chain", recording)
    sched = make_scheduler(tiny_model, "slice")
    await sched.start()
    try:
        first = await sched.time_direct([1, 2, 3, 4], 1)
        both = await sched.time_direct([1, 2, 3, 4], 3, device="cpu:1")
    finally:
        await sched.stop()
    assert first.device == "cpu:0" and 0 < first.first_token_s <= first.total_s
    assert both.device == "cpu:1" and 0 < both.first_token_s < both.total_s
    assert threads == ["exec-cpu:0"] + ["exec-cpu:1"] * 3  # one chain per token


async def test_an_unknown_or_lost_device_is_refused(tiny_model: models.Model,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    sched = make_scheduler(tiny_model, "slice")
    await sched.start()
    try:
        with pytest.raises(DirectUnavailable, match="no device 'cuda:7'"):
            await sched.time_direct([1, 2], 1, device="cuda:7")
        monkeypatch.setattr(sched.exec, "alive", lambda device: device != "cpu:1")
        with pytest.raises(DirectUnavailable, match="cpu:1 is down"):
            await sched.time_direct([1, 2], 1, device="cpu:1")
        assert (await sched.time_direct([1, 2], 1)).device == "cpu:0"
    finally:
        await sched.stop()
