"""LoRA adapters through a real server and the official client: an unload that waits for
the streams in flight, and greedy tokens of adapters equal to transformers + peft."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from gateway.config import load_config
from gateway.engine import build_engine
from gateway.lora import ModelAdapters
from scheduler.scheduler import Scheduler
from tests.gateway.harness import (
    EngineFactory,
    FakeAdapterHost,
    adapter_folder,
    auth_config,
    live_server,
    with_adapters,
)
from tests.models.peft_ref import ALL, greedy, make_adapter, reference_model

ADMIN = {"authorization": "Bearer sk-admin-1"}
UNLOAD = "/v1/unload_lora_adapter"


def test_unload_waits_for_streams_in_flight(make_engine: EngineFactory, tmp_path: Path) -> None:
    """Two streams run on an adapter; it is unloaded meanwhile: new requests on it are 404
    at once, both streams end normally, and the adapter leaves only after the last."""
    host = FakeAdapterHost()
    engine = with_adapters(make_engine(token_delay_s=0.02), host,
                           sql=adapter_folder(tmp_path / "sql"))
    with live_server(auth_config(), engine) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="sk-ide-1", max_retries=0)
        texts: list[str] = []
        errors: list[BaseException] = []

        def stream(max_tokens: int) -> None:
            try:
                parts = [c.choices[0].text for c in client.completions.create(
                    model="sql", prompt="hello", max_tokens=max_tokens, stream=True)
                    if c.choices]
                texts.append("".join(parts))
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=stream, args=(n,)) for n in (30, 60)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10
        while engine.adapters.in_flight("sql") < 2:
            assert time.monotonic() < deadline, "the streams did not start"
            time.sleep(0.005)
        r = httpx.post(server.url + UNLOAD, headers=ADMIN, json={"lora_name": "sql"})
        assert r.status_code == 200 and host.removed == []  # still in use
        with pytest.raises(openai.NotFoundError) as gone:
            client.completions.create(model="sql", prompt="hi", max_tokens=2)
        assert gone.value.code == "model_not_found"
        assert "sql" not in [m.id for m in client.models.list()]
        for t in threads:
            t.join(timeout=30)
        assert errors == [] and len(texts) == 2 and all(texts)
        assert host.removed == ["sql"] and engine.adapters.in_flight("sql") == 0


PROMPTS = ["The capital of France is", "def fibonacci(n):"]


@pytest.fixture(scope="module")
def peft_adapters(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
                  ) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {"all": make_adapter(default_model_dir, root / "all", ALL, 8, 16, seed=1,
                                scale=0.5),
            "qv": make_adapter(default_model_dir, root / "qv", ["q_proj", "v_proj"], 16, 32,
                               seed=2, scale=0.5)}


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing`:FutureWarning")
def test_adapters_through_the_server_equal_transformers_and_peft(
        default_model_dir: Path, peft_adapters: dict[str, Path]) -> None:
    """One adapter named at start-up, one loaded at run time: through the official client,
    greedy text of each (and of the base) equals transformers + peft in fp32."""
    config = load_config(None, {"model.spec": "default", "model.dtype": "float32",
                                "scheduler.devices": "cpu:0", "model.lora_reserve_gib": 0.05,
                                "model.lora": {"all": str(peft_adapters["all"])}})
    engine = build_engine(config)
    tokenizer = engine.tokenizer
    with live_server(config, engine) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        r = httpx.post(server.url + "/v1/load_lora_adapter",
                       json={"lora_name": "qv", "lora_path": str(peft_adapters["qv"])})
        assert r.status_code == 200, r.text
        models = {m.id: m for m in client.models.list()}
        assert set(models) == {engine.served_model_name, "all", "qv"}
        assert models["qv"].model_extra == {"root": str(peft_adapters["qv"]),
                                            "parent": engine.served_model_name,
                                            "max_model_len": engine.max_model_len}
        texts: dict[str | None, list[str]] = {}
        for name in (None, "all", "qv"):
            ref = reference_model(default_model_dir, None if name is None
                                  else peft_adapters[name])
            for prompt in PROMPTS:
                ids = tokenizer.encode(prompt)
                want = tokenizer.decode(greedy(ref, ids, 8), skip_special_tokens=True)
                got = client.completions.create(
                    model=name or engine.served_model_name, prompt=prompt, max_tokens=8,
                    temperature=0, extra_body={"ignore_eos": True})
                assert got.model == (name or engine.served_model_name)
                assert got.choices[0].text == want, (name, prompt)
                texts.setdefault(name, []).append(want)
        assert texts["all"] != texts[None] and texts["qv"] != texts[None]  # they change tokens
        r = httpx.post(server.url + "/v1/unload_lora_adapter", json={"lora_name": "qv"})
        assert r.status_code == 200, r.text
        assert [m.id for m in client.models.list()] == [engine.served_model_name, "all"]
        host = engine.adapters.host
        assert isinstance(host, ModelAdapters) and host.model.adapters.names() == ["all"]
        assert isinstance(engine.scheduler, Scheduler)
        assert engine.scheduler.requests_on_adapter("all") == 0
