"""LoRA adapters through the real scheduler: tokens equal transformers + peft, adapter and
base requests in one batch, prefix-cache blocks kept apart per adapter, the memory reserve."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import models
from executors.types import Device, Priority
from models.lora import AdapterError, load_peft_adapter
from models.modelset import adapters_of, model_set
from models.sampling_params import SamplingParams
from scheduler.api import Request
from scheduler.config import SchedulerConfig
from scheduler.scheduler import Scheduler
from tests.models.peft_ref import ALL, greedy, make_adapter, reference_model
from tests.scheduler.conftest import linear_time, stream, xfer_time

pytestmark = pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing`:FutureWarning")

GREEDY = SamplingParams(temperature=0, max_tokens=8)
BASE = [(13 * j) % 900 + 7 for j in range(100)]  # 6 full blocks of 16, and 4 tokens


@pytest.fixture(scope="module")
def adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
             ) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {"a": make_adapter(tiny_model_dir, root / "a", ALL, 8, 16, seed=1),
            "b": make_adapter(tiny_model_dir, root / "b", ["q_proj", "v_proj"], 4, 8, seed=2)}


@pytest.fixture
def model(tiny_model_dir: Path, adapters: dict[str, Path]) -> models.Model:
    m = models.load(tiny_model_dir, dtype="float32")
    for name, path in adapters.items():
        m.adapters.add(load_peft_adapter(name, path, m))
    return m


def _scheduler(model: models.Model, policy: str = "slice", **cfg: object) -> Scheduler:
    devs = [Device("cpu:0", 256 << 20), Device("cpu:1", 256 << 20)]
    config = SchedulerConfig(policy=policy, max_model_len=1024, max_batch_tokens=512,
                             **cfg)  # type: ignore[arg-type]
    return Scheduler(model, devs, policy, linear_time, xfer_time, config)


async def _run(sched: Scheduler, rid: str, prompt: list[int], adapter: str | None
               ) -> tuple[list[int], int]:
    out = await stream(sched, Request(rid, "t", Priority.HIGH, prompt, GREEDY, adapter=adapter))
    return out.tokens, out.num_cached


def _want(tiny_model_dir: Path, adapters: dict[str, Path], name: str | None,
          prompt: list[int]) -> list[int]:
    ref = reference_model(tiny_model_dir, None if name is None else adapters[name])
    return greedy(ref, prompt, GREEDY.max_tokens)


@pytest.mark.parametrize("policy", ["slice", "fcfs"])
async def test_adapter_requests_equal_peft_beside_base_requests(
        model: models.Model, tiny_model_dir: Path, adapters: dict[str, Path],
        policy: str) -> None:
    runs = [("base", BASE[:30], None), ("a", BASE[:30], "a"), ("b", BASE[10:50], "b"),
            ("a2", BASE[5:20], "a"), ("base2", BASE[10:50], None)]
    sched = _scheduler(model, policy, prefix_caching=False)
    await sched.start()
    try:
        got = await asyncio.gather(*(_run(sched, rid, p, a) for rid, p, a in runs))
    finally:
        await sched.stop()
    for (rid, prompt, adapter), (tokens, _) in zip(runs, got, strict=True):
        assert tokens == _want(tiny_model_dir, adapters, adapter, prompt), rid
    assert len({tuple(t) for t, _ in got[:2]}) == 2, "the adapter changes the tokens"


async def test_the_prefix_cache_keeps_adapters_apart(
        model: models.Model, tiny_model_dir: Path, adapters: dict[str, Path]) -> None:
    sched = _scheduler(model)
    await sched.start()
    try:
        assert (await _run(sched, "base", BASE, None))[1] == 0
        tokens, cached = await _run(sched, "a", BASE, "a")
        assert cached == 0 and tokens == _want(tiny_model_dir, adapters, "a", BASE)
        tokens, cached = await _run(sched, "a-again", BASE, "a")
        assert cached == 96 and tokens == _want(tiny_model_dir, adapters, "a", BASE)
        assert (await _run(sched, "b", BASE, "b"))[1] == 0
        assert (await _run(sched, "base-again", BASE, None))[1] == 96
    finally:
        await sched.stop()


async def test_the_adapter_reserve_is_kept_on_every_device(
        model: models.Model, adapters: dict[str, Path]) -> None:
    loaded = model.adapters.memory_bytes()
    extra = load_peft_adapter("c", adapters["a"], model)
    reserve = loaded + model.adapters.cost_bytes(extra) - 1
    sched = _scheduler(model, lora_reserve_bytes=reserve)
    await sched.start()
    try:
        for dev in ("cpu:0", "cpu:1"):
            assert sched.ledgers[dev].used("adapters") == reserve
        with pytest.raises(AdapterError, match="reserve of"):
            model.adapters.add(extra)
        model.adapters.remove("a")
        model.adapters.add(extra)  # the room "a" left
    finally:
        await sched.stop()


async def test_a_request_of_an_adapter_not_loaded_is_refused_at_submit(
        model: models.Model) -> None:
    sched = _scheduler(model)
    await sched.start()
    try:
        with pytest.raises(AdapterError, match="adapter 'nope' is not loaded"):
            sched.submit(Request("r", "t", Priority.HIGH, BASE, GREEDY, adapter="nope"))
        model.adapters.remove("b")
        with pytest.raises(AdapterError, match="adapter 'b' is not loaded"):
            sched.submit(Request("r", "t", Priority.HIGH, BASE, GREEDY, adapter="b"))
        assert (await _run(sched, "a", BASE[:20], "a"))[0]  # the others still run
    finally:
        await sched.stop()


def test_a_reserve_past_the_budget_fails_at_start_up(model: models.Model) -> None:
    with pytest.raises(ValueError, match="LoRA reserve of"):
        _scheduler(model, lora_reserve_bytes=300 << 20)
    with pytest.raises(ValueError, match="lora_reserve_bytes"):
        SchedulerConfig(lora_reserve_bytes=-1)


def test_ray_devices_refuse_adapters(model: models.Model, tiny_model_dir: Path) -> None:
    remote = [Device("10.0.0.7/cpu:0", 256 << 20)]
    cfg = SchedulerConfig(policy="fcfs", max_model_len=1024, max_batch_tokens=512)
    with pytest.raises(AdapterError, match=r"not supported on Ray executors yet \(loaded: a, b"):
        Scheduler(model, remote, "fcfs", linear_time, xfer_time, cfg)
    plain = models.load(tiny_model_dir, dtype="float32")
    Scheduler(plain, remote, "fcfs", linear_time, xfer_time, cfg)  # built, never started
    assert plain.adapters.can_add(model.adapters.get("a")) == (  # type: ignore[arg-type]
        "LoRA adapters are not supported on Ray executors yet")


async def test_requests_on_adapter_counts_them_until_they_end(model: models.Model) -> None:
    """What the gateway waits on before it removes an unloaded adapter."""
    sched = _scheduler(model)
    await sched.start()
    try:
        stream = sched.submit(Request("r", "t", Priority.HIGH, BASE[:30], GREEDY, adapter="a"))
        first = await anext(stream)
        assert first is not None
        assert sched.requests_on_adapter("a") == 1 and sched.requests_on_adapter("b") == 0
        sched.abort("r", "abort")
        async for _ in stream:
            pass
        deadline = asyncio.get_running_loop().time() + 10
        while sched.requests_on_adapter("a"):
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
    finally:
        await sched.stop()


async def test_an_adapter_of_the_second_model_of_a_set_runs_and_is_budgeted_there(
        tiny_model_dir: Path, tiny_qwen2_dir: Path, tmp_path: Path) -> None:
    """A set of the tiny Llama on cpu:0 and the tiny Qwen2 on cpu:1: an adapter of the Qwen2
    is in its member's set only, its bytes counted on cpu:1 only, it is refused on the first
    model, and its greedy tokens on the second equal peft's."""
    path = make_adapter(tiny_qwen2_dir, tmp_path / "q", ALL, 8, 16, seed=3)
    chat = models.load(tiny_model_dir, dtype="float32")
    small = models.load(tiny_qwen2_dir, dtype="float32")
    small.adapters.add(load_peft_adapter("q", path, small))
    s = model_set([("chat", chat, ("cpu:0",)), ("small", small, ("cpu:1",))])
    sched = _scheduler(s)
    await sched.start()
    try:
        cost = small.adapters.memory_bytes()
        assert cost > 0 and adapters_of(s, "small") is small.adapters
        assert "q" not in adapters_of(s) and "q" not in chat.adapters
        assert sched.ledgers["cpu:1"].used("adapters") == cost
        assert sched.ledgers["cpu:0"].used("adapters") == 0
        with pytest.raises(AdapterError, match="adapter 'q' is not loaded"):
            sched.submit(Request("r", "t", Priority.HIGH, BASE, GREEDY, adapter="q",
                                 model="chat"))
        tokens = []
        async for ev in sched.submit(Request("r2", "t", Priority.HIGH, BASE[:20], GREEDY,
                                             adapter="q", model="small")):
            if ev.token_id is not None:
                tokens.append(ev.token_id)
        ref = reference_model(tiny_qwen2_dir, path)
        assert tokens == greedy(ref, BASE[:20], GREEDY.max_tokens)
        assert tokens != greedy(reference_model(tiny_qwen2_dir, None), BASE[:20],
                                GREEDY.max_tokens)
    finally:
        await sched.stop()
