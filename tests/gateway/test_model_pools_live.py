"""Two base models of different KV layout and tokenizer in one real server (uvicorn on
loopback, the openai client): `chat` (SmolLM2-135M, 30 layers, 3 KV heads) and `small`
(tiny-random-qwen2, 4 layers, its own 1.5k-token BPE), fp32, greedy. Each model's text,
token ids and context are those of that model served alone."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import Iterator

import httpx
import openai
import pytest
import torch

from gateway.config import GatewayConfig, load_config
from gateway.engine import Engine, build_engine
from tests.gateway.batches.helpers import CHAT as CHAT_URL
from tests.gateway.batches.helpers import COMPLETIONS, line, results, submit, wait_for
from tests.gateway.harness import LiveServer, auth_config, live_server

KEY = "sk-ide-1"
PROMPTS = ["The capital of France is", "def add(a, b):\n    return"]
CHAT = [{"role": "user", "content": "Name a colour."}]


def _engine(settings: dict[str, object]) -> Engine:
    return build_engine(load_config(None, {"model.dtype": "float32",
                                           "scheduler.devices": "cpu:0", **settings}))


def _config(tmp: pytest.TempPathFactory) -> GatewayConfig:
    """The tenants of the harness, and a data dir of its own (each server locks one)."""
    config = auth_config()
    return dataclasses.replace(config, batch=dataclasses.replace(
        config.batch, data_dir=str(tmp.mktemp("data"))))


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    engine = _engine({"model.models": [{"name": "chat", "spec": "default"},
                                       {"name": "small", "spec": "tiny-random-qwen2"}]})
    with live_server(_config(tmp_path_factory), engine) as server:
        yield server


@pytest.fixture(scope="module")
def alone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, LiveServer]]:
    """Each model served alone, under the name the pair gives it."""
    chat = _engine({"model.spec": "default", "model.served_model_name": "chat"})
    small = _engine({"model.spec": "tiny-random-qwen2", "model.served_model_name": "small"})
    with live_server(_config(tmp_path_factory), chat) as c, \
            live_server(_config(tmp_path_factory), small) as s:
        yield {"chat": c, "small": s}


def _client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)


def _post(server: LiveServer, path: str, body: dict[str, object]) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {KEY}"})


def test_each_model_has_pools_of_its_own_layout_and_its_own_context(pair: LiveServer) -> None:
    pools = pair.engine.scheduler.kv.pools  # type: ignore[attr-defined]
    assert set(pools) == {"cpu:0", "cpu:0#small"}
    assert len(pools["cpu:0"].layers) == 30 and len(pools["cpu:0#small"].layers) == 4
    cards = {m.id: m for m in _client(pair).models.list()}
    assert set(cards) == {"chat", "small"}
    small_card = cards["small"].model_dump()
    assert small_card["root"].endswith("tiny-random-qwen2-v1")
    # small's pool holds as many tokens as chat's (equal shares), so as long a context
    assert small_card["max_model_len"] == pair.engine.of("small").max_model_len > 0
    for model in ("chat", "small"):  # each model's chain, its prompt in its own tokens
        direct = httpx.post(f"{pair.url}/admin/direct", timeout=60, json={
            "model": model, "prompt": PROMPTS[1], "max_tokens": 2},
            headers={"Authorization": "Bearer sk-admin-1"})
        assert direct.status_code == 200 and direct.json()["total_s"] > 0, direct.text
        ids = pair.engine.of(model if model != "chat" else "").tokenizer.encode(PROMPTS[1])
        assert direct.json()["prompt_tokens"] == len(ids)  # 9 and 13


def test_tokenize_and_detokenize_use_the_named_models_tokenizer(
        pair: LiveServer, alone: dict[str, LiveServer]) -> None:
    ids = {}
    for model in ("chat", "small"):
        for body in ({"model": model, "prompt": PROMPTS[1]},
                     {"model": model, "messages": CHAT, "add_generation_prompt": True}):
            got = _post(pair, "/tokenize", body).json()
            assert got == _post(alone[model], "/tokenize", body).json()
        ids[model] = _post(pair, "/tokenize", {"model": model, "prompt": PROMPTS[0]}).json()
        text = _post(pair, "/detokenize", {"model": model, "tokens": ids[model]["tokens"]})
        assert text.json()["prompt"].endswith(PROMPTS[0])
    assert ids["chat"]["tokens"] != ids["small"]["tokens"]
    big = max(ids["chat"]["tokens"]) + 2000  # in chat's 49k vocabulary, past small's 1.5k
    assert _post(pair, "/detokenize", {"model": "chat", "tokens": [big]}).status_code == 200
    refused = _post(pair, "/detokenize", {"model": "small", "tokens": [big]})
    assert refused.status_code == 400 and "size 1536" in refused.json()["error"]["message"]


def test_completions_chat_and_streams_equal_each_model_alone(
        pair: LiveServer, alone: dict[str, LiveServer]) -> None:
    client = _client(pair)
    for model in ("chat", "small"):
        ref = _client(alone[model])
        for prompt in PROMPTS:
            kw = {"model": model, "prompt": prompt, "max_tokens": 12, "temperature": 0}
            got = client.completions.create(**kw)  # type: ignore[call-overload]
            want = ref.completions.create(**kw)  # type: ignore[call-overload]
            assert got.model == model and got.choices[0].text == want.choices[0].text != ""
            assert got.usage.prompt_tokens == want.usage.prompt_tokens
            streamed = "".join(c.choices[0].text for c in client.completions.create(
                **kw, stream=True))  # type: ignore[call-overload]
            assert streamed == want.choices[0].text
        kw = {"model": model, "messages": CHAT, "max_tokens": 10, "temperature": 0}
        got_chat = client.chat.completions.create(**kw)  # type: ignore[call-overload]
        want_chat = ref.chat.completions.create(**kw)  # type: ignore[call-overload]
        assert got_chat.choices[0].message.content == want_chat.choices[0].message.content
        assert got_chat.usage.prompt_tokens == want_chat.usage.prompt_tokens
        chunks = client.chat.completions.create(**kw, stream=True)  # type: ignore[call-overload]
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
            want_chat.choices[0].message.content


def test_logprobs_and_stop_strings_read_each_models_tokens(
        pair: LiveServer, alone: dict[str, LiveServer]) -> None:
    for model in ("chat", "small"):
        kw = {"model": model, "prompt": PROMPTS[0], "max_tokens": 8, "temperature": 0,
              "logprobs": 1}
        got = _client(pair).completions.create(**kw)  # type: ignore[call-overload]
        want = _client(alone[model]).completions.create(**kw)  # type: ignore[call-overload]
        assert got.choices[0].logprobs.tokens == want.choices[0].logprobs.tokens
        assert "".join(got.choices[0].logprobs.tokens) == got.choices[0].text
        stop = want.choices[0].text[3:6]
        cut = _client(pair).completions.create(**{**kw, "stop": [stop]})  # type: ignore
        assert cut.choices[0].finish_reason == "stop"
        assert cut.choices[0].text == want.choices[0].text.split(stop)[0]


async def test_concurrent_requests_of_both_models_get_what_each_gets_alone(
        pair: LiveServer, alone: dict[str, LiveServer]) -> None:
    want = {m: _client(alone[m]).completions.create(
        model=m, prompt=PROMPTS[0], max_tokens=10, temperature=0).choices[0].text
        for m in ("chat", "small")}
    client = openai.AsyncOpenAI(base_url=f"{pair.url}/v1", api_key=KEY, max_retries=0)
    outs = await asyncio.gather(*(client.completions.create(
        model=m, prompt=PROMPTS[0], max_tokens=10, temperature=0)
        for m in ("chat", "small") * 3))
    await client.close()
    assert [o.choices[0].text for o in outs] == [want["chat"], want["small"]] * 3


def test_structured_output_masks_follow_each_models_vocabulary(pair: LiveServer) -> None:
    # NOTE: a mask built from chat's 49k vocabulary would not fit small's 1.5k logits
    for model in ("chat", "small"):
        for body, check in (({"guided_choice": ["yes", "no"]}, lambda t: t in ("yes", "no")),
                            ({"guided_regex": r"[0-9]{3}-[0-9]{4}"},
                             lambda t: re.fullmatch(r"[0-9]{3}-[0-9]{4}", t) is not None)):
            out = _post(pair, "/v1/chat/completions", {
                "model": model, "messages": CHAT, "max_tokens": 16, "temperature": 0,
                **body}).json()
            assert check(out["choices"][0]["message"]["content"]), (model, out)


async def test_a_batch_file_naming_both_models_tokenizes_each_line_with_its_model(
        pair: LiveServer, alone: dict[str, LiveServer]) -> None:
    files = {COMPLETIONS: [line(i, COMPLETIONS, model=m, prompt=PROMPTS[0], max_tokens=8)
                           for i, m in enumerate(("chat", "small"))],
             CHAT_URL: [line(i, model=m, messages=CHAT, max_tokens=8)
                        for i, m in enumerate(("chat", "small"))]}
    async with httpx.AsyncClient(base_url=pair.url, timeout=60) as client:
        for url, lines in files.items():
            batch = await submit(client, KEY, lines, url)
            done = await wait_for(client, KEY, batch["id"], timeout_s=120)
            assert done["status"] == "completed", done
            out = {r["custom_id"]: r["response"]["body"]
                   for r in await results(client, KEY, done["output_file_id"])}
            for i, model in enumerate(("chat", "small")):
                ref = _client(alone[model])
                if url == COMPLETIONS:
                    want = ref.completions.create(model=model, prompt=PROMPTS[0], max_tokens=8,
                                                  temperature=0).choices[0].text
                    assert out[f"req-{i}"]["choices"][0]["text"] == want
                else:
                    want = ref.chat.completions.create(
                        model=model, messages=CHAT, max_tokens=8,  # type: ignore[arg-type]
                        temperature=0).choices[0].message.content
                    assert out[f"req-{i}"]["choices"][0]["message"]["content"] == want


def test_one_model_in_bfloat16_beside_itself_in_float32(
        tmp_path_factory: pytest.TempPathFactory, alone: dict[str, LiveServer]) -> None:
    engine = _engine({"model.models": [{"name": "half", "spec": "default",
                                        "dtype": "bfloat16"},
                                       {"name": "chat", "spec": "default"}]})
    pools = engine.scheduler.kv.pools  # type: ignore[attr-defined]
    assert set(pools) == {"cpu:0", "cpu:0#chat"}
    assert pools["cpu:0"].keys[0].dtype == torch.bfloat16
    assert pools["cpu:0#chat"].keys[0].dtype == torch.float32
    # equal shares, equal tokens: the fp32 pool has twice the bytes of the bf16 one
    assert pools["cpu:0"].allocator.num_blocks == pools["cpu:0#chat"].allocator.num_blocks
    with live_server(_config(tmp_path_factory), engine) as server:
        kw = {"prompt": PROMPTS[0], "max_tokens": 12, "temperature": 0}
        want = _client(alone["chat"]).completions.create(model="chat", **kw)  # type: ignore
        got = _client(server).completions.create(model="chat", **kw)  # type: ignore
        half = _client(server).completions.create(model="half", **kw)  # type: ignore
    assert got.choices[0].text == want.choices[0].text
    assert half.choices[0].text != "" and half.model == "half"
