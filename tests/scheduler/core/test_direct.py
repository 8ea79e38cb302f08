"""`Scheduler.time_direct`: a request's chain timed on a device's executor thread."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

import models
from models import generate as generate_module
from models.batch import Batch
from models.lora import load_peft_adapter
from models.modelset import model_set
from scheduler.api import DirectUnavailable
from tests.models.peft_ref import make_adapter
from tests.scheduler.conftest import make_scheduler

pytestmark = pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing`:FutureWarning")


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


async def test_a_sets_member_chain_runs_on_a_device_it_runs_on(
        tiny_model: models.Model, monkeypatch: pytest.MonkeyPatch) -> None:
    """Of a set, `model` names the chain timed; its default device is the first it runs on,
    and a device it does not run on, or a model nobody serves, is refused."""
    small = models.load("tiny-random-qwen2", dtype="float32")
    chains: list[tuple[models.Model, str]] = []
    real = generate_module.run_chain

    def recording(*args: object) -> torch.Tensor:
        chains.append((args[0], threading.current_thread().name))  # type: ignore[arg-type]
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(generate_module, "run_chain", recording)
    sched = make_scheduler(model_set([("chat", tiny_model, None),
                                      ("small", small, ("cpu:1",))]), "slice")
    await sched.start()
    try:
        assert (await sched.time_direct([1, 2, 3], 1, model="small")).device == "cpu:1"
        assert (await sched.time_direct([1, 2, 3], 1)).device == "cpu:0"  # the first model
        with pytest.raises(DirectUnavailable, match="Model 'small' has no device 'cpu:0'; "
                                                    "it runs on cpu:1"):
            await sched.time_direct([1, 2], 1, device="cpu:0", model="small")
        with pytest.raises(DirectUnavailable, match="serves no model 'big'"):
            await sched.time_direct([1, 2], 1, model="big")
    finally:
        await sched.stop()
    assert chains == [(small, "exec-cpu:1"), (tiny_model, "exec-cpu:0")]
    with pytest.raises(DirectUnavailable, match="one unnamed model, not 'small'"):
        await make_scheduler(tiny_model, "slice").time_direct([1, 2], 1, model="small")


async def test_an_adapters_request_runs_its_base_chain_with_the_adapters_rows(
        tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = models.load(tiny_model_dir, dtype="float32")
    path = make_adapter(tiny_model_dir, tmp_path / "a", ["q_proj", "v_proj"], 4, 8, seed=1)
    model.adapters.add(load_peft_adapter("a", path, model))
    seen: list[tuple[str | None, bool]] = []
    real = generate_module.run_chain

    def recording(m: models.Model, batch: Batch, *rest: object) -> torch.Tensor:
        out = real(m, batch, *rest)  # type: ignore[arg-type]
        seen.append((batch.seqs[0].adapter, batch.lora is not None))
        return out

    monkeypatch.setattr(generate_module, "run_chain", recording)
    sched = make_scheduler(model, "slice")
    await sched.start()
    try:
        assert (await sched.time_direct([1, 2, 3], 2, adapter="a")).total_s > 0
        await sched.time_direct([1, 2, 3], 1)
        with pytest.raises(DirectUnavailable, match="no LoRA adapter 'nope' loaded") as e:
            await sched.time_direct([1, 2], 1, adapter="nope")
        assert e.value.param == "model"
    finally:
        await sched.stop()
    assert seen == [("a", True), ("a", True), (None, False)]  # the layers applied its rows
