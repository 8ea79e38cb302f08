"""LoRA adapters on the second model of a server of two, through a real server and the
official client: `chat` (the tiny Llama) and `small` (the tiny Qwen2), of the same shapes,
fp32. Which base an adapter runs on (its folder's `base_model_name_or_path`, or
`base_model_name`), `/v1/models`' `parent`, greedy tokens equal to transformers + peft, and
load / unload at run time on the second model."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from gateway.config import load_config
from gateway.engine import Engine, build_engine
from models.modelset import ModelSet, adapters_of
from tests.gateway.harness import LiveServer, auth_config, live_server
from tests.models.peft_ref import ALL, greedy, make_adapter, reference_model

pytestmark = pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing`:FutureWarning")

ADMIN = {"authorization": "Bearer sk-admin-1"}
KEY = "sk-ide-1"
PROMPT = [5, 17, 101, 33, 250, 12, 7, 64]


@pytest.fixture(scope="module")
def folders(tiny_qwen2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Adapters of the Qwen2 (`small`): `q` and `later` name its folder as their base;
    `anon` is `q` whose config names a base nobody serves."""
    root = tmp_path_factory.mktemp("adapters")
    q = make_adapter(tiny_qwen2_dir, root / "q", ALL, 8, 16, seed=1)
    later = make_adapter(tiny_qwen2_dir, root / "later", ["q_proj", "v_proj"], 4, 8, seed=2)
    anon = root / "anon"
    anon.mkdir()
    for f in q.iterdir():
        (anon / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((anon / "adapter_config.json").read_text())
    (anon / "adapter_config.json").write_text(json.dumps(
        {**cfg, "base_model_name_or_path": "nobody/serves-this"}))
    return {"q": q, "later": later, "anon": anon}


@pytest.fixture(scope="module")
def server(folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[LiveServer, Engine]]:
    config = load_config(None, {
        "model.dtype": "float32", "scheduler.devices": "cpu:0",
        "model.models": [{"name": "chat", "spec": "tiny-random"},
                         {"name": "small", "spec": "tiny-random-qwen2"}],
        "model.lora_reserve_gib": 0.01,
        "model.lora": {"q": str(folders["q"]),  # its folder names small's
                       "pinned": {"path": str(folders["anon"]), "base_model_name": "small"}}})
    engine = build_engine(config)
    served = auth_config()
    served = dataclasses.replace(served, batch=dataclasses.replace(
        served.batch, data_dir=str(tmp_path_factory.mktemp("data"))))
    with live_server(served, engine) as live:
        yield live, engine


def _sets(engine: Engine) -> tuple[list[str], list[str]]:
    model = engine.scheduler.model  # type: ignore[attr-defined]
    assert isinstance(model, ModelSet)
    return adapters_of(model, "chat").names(), adapters_of(model, "small").names()


def _load(live: LiveServer, body: dict[str, str]) -> httpx.Response:
    return httpx.post(live.url + "/v1/load_lora_adapter", headers=ADMIN, json=body, timeout=60)


def _text(client: openai.OpenAI, model: str) -> str:
    out = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0)
    return out.choices[0].text


def _want(engine: Engine, base: Path, adapter: Path | None) -> str:
    ids = greedy(reference_model(base, adapter), PROMPT, 8)
    return engine.of("small").tokenizer.decode(ids, skip_special_tokens=True)


def test_an_adapter_runs_on_the_base_its_folder_names_and_lists_it_as_parent(
        server: tuple[LiveServer, Engine], tiny_qwen2_dir: Path, folders: dict[str, Path]
        ) -> None:
    live, engine = server
    assert _sets(engine) == ([], ["q", "pinned"])
    client = openai.OpenAI(base_url=live.url + "/v1", api_key=KEY, max_retries=0)
    cards = {m.id: m.model_extra for m in client.models.list()}
    assert cards["q"] == {"root": str(folders["q"]), "parent": "small",
                          "max_model_len": engine.of("small").max_model_len}
    want = _want(engine, tiny_qwen2_dir, folders["q"])
    assert _text(client, "q") == want != _want(engine, tiny_qwen2_dir, None)
    assert _text(client, "small") == _want(engine, tiny_qwen2_dir, None)


def test_load_and_unload_on_the_second_model_at_run_time(
        server: tuple[LiveServer, Engine], tiny_qwen2_dir: Path, folders: dict[str, Path]
        ) -> None:
    live, engine = server
    client = openai.OpenAI(base_url=live.url + "/v1", api_key=KEY, max_retries=0)
    r = _load(live, {"lora_name": "later", "lora_path": str(folders["later"])})
    assert r.status_code == 200, r.text
    assert _sets(engine) == ([], ["q", "pinned", "later"])
    assert _text(client, "later") == _want(engine, tiny_qwen2_dir, folders["later"])
    r = httpx.post(live.url + "/v1/unload_lora_adapter", headers=ADMIN,
                   json={"lora_name": "later"})
    assert r.status_code == 200, r.text
    assert _sets(engine) == ([], ["q", "pinned"])
    with pytest.raises(openai.NotFoundError):
        _text(client, "later")


def test_a_base_nobody_serves_in_the_config_falls_to_the_first_model_it_fits_and_a_named_base_wins(
        server: tuple[LiveServer, Engine], folders: dict[str, Path]) -> None:
    """The tiny models have the same shapes: the folder's `base_model_name_or_path` (or
    `base_model_name`) is what picks the base."""
    live, engine = server
    client = openai.OpenAI(base_url=live.url + "/v1", api_key=KEY, max_retries=0)
    assert _load(live, {"lora_name": "anon", "lora_path": str(folders["anon"])}
                 ).status_code == 200
    r = _load(live, {"lora_name": "named", "lora_path": str(folders["anon"]),
                     "base_model_name": "small"})
    assert r.status_code == 200, r.text
    assert _sets(engine) == (["anon"], ["q", "pinned", "named"])
    parents = {m.id: (m.model_extra or {})["parent"] for m in client.models.list()}
    assert parents["anon"] == "chat" and parents["named"] == parents["pinned"] == "small"
    # the same weights: on the same base the same text, on the other base another
    assert _text(client, "named") == _text(client, "pinned") == _text(client, "q")
    assert _text(client, "anon") != _text(client, "q")
    r = _load(live, {"lora_name": "nowhere", "lora_path": str(folders["q"]),
                     "base_model_name": "big"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_lora_adapter"
    assert "base model 'big' is not served (served: chat, small)" in r.json()["error"]["message"]
    for name in ("anon", "named"):
        httpx.post(live.url + "/v1/unload_lora_adapter", headers=ADMIN, json={"lora_name": name})
    assert _sets(engine) == ([], ["q", "pinned"])
