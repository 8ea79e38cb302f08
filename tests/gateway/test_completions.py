"""POST /v1/completions and /v1/chat/completions, non-streaming, through ASGITransport."""

from __future__ import annotations

import pytest

from tests.gateway.harness import MAX_MODEL_LEN, EngineFactory, Harness, make_config, running

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def _complete(h: Harness, **body: object) -> dict:
    response = await h.client.post("/v1/completions", json={"model": "tiny", **body})
    assert response.status_code == 200, response.text
    return response.json()


async def test_completion_shape_and_usage(gateway: Harness) -> None:
    response = await gateway.client.post("/v1/completions",
                                         json={"model": "tiny", "prompt": "Hello world",
                                               "max_tokens": 5})
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.headers["x-slicegate-priority"] == "high"
    assert response.headers["x-request-id"]
    body = response.json()
    assert body["object"] == "text_completion" and body["model"] == "tiny"
    assert body["id"].startswith("cmpl-") and isinstance(body["created"], int)
    [choice] = body["choices"]
    assert choice["index"] == 0 and choice["finish_reason"] == "length" and choice["text"]
    prompt_tokens = len(gateway.engine.tokenizer.encode("Hello world"))
    assert body["usage"] == {"prompt_tokens": prompt_tokens, "completion_tokens": 5,
                             "total_tokens": prompt_tokens + 5,
                             "prompt_tokens_details": {"cached_tokens": 0}}
    assert gateway.fake.kv_blocks_in_use == 0


async def test_defaults_model_optional_and_max_tokens_16(gateway: Harness) -> None:
    response = await gateway.client.post("/v1/completions", json={"prompt": "Hi"})
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] == 16


async def test_same_seed_same_text(gateway: Harness) -> None:
    a = await _complete(gateway, prompt="Tell me", max_tokens=12, seed=3)
    b = await _complete(gateway, prompt="Tell me", max_tokens=12, seed=3)
    assert a["choices"][0]["text"] == b["choices"][0]["text"]


async def test_prompt_forms(gateway: Harness) -> None:
    ids = gateway.engine.tokenizer.encode("the river")
    single = await _complete(gateway, prompt=ids, max_tokens=3)
    assert single["usage"]["prompt_tokens"] == len(ids)
    many = await _complete(gateway, prompt=["a b", "c d e", "f"], max_tokens=4)
    assert [c["index"] for c in many["choices"]] == [0, 1, 2]
    assert many["usage"]["completion_tokens"] == 12
    nested = await _complete(gateway, prompt=[ids, ids[:1]], max_tokens=2)
    assert len(nested["choices"]) == 2
    assert nested["usage"]["prompt_tokens"] == len(ids) + 1


async def test_stop_string_is_never_leaked(gateway: Harness) -> None:
    full = (await _complete(gateway, prompt="stop test", max_tokens=40, seed=5))
    text = full["choices"][0]["text"]
    stop = text[12:16]
    cut = text.find(stop)
    result = await _complete(gateway, prompt="stop test", max_tokens=40, seed=5,
                             stop=[stop, "never-there"])
    [choice] = result["choices"]
    assert choice["text"] == text[:cut] and choice["finish_reason"] == "stop"
    assert stop not in choice["text"]
    assert result["usage"]["completion_tokens"] < 40
    assert gateway.fake.abort_reasons["stop"] >= 1 and gateway.fake.kv_blocks_in_use == 0


async def test_stop_string_ignored_before_min_tokens(gateway: Harness) -> None:
    text = (await _complete(gateway, prompt="mt", max_tokens=30, seed=2))["choices"][0]["text"]
    first_word = text.split()[0]
    result = await _complete(gateway, prompt="mt", max_tokens=30, seed=2, stop=first_word,
                             min_tokens=30)
    assert result["choices"][0]["finish_reason"] == "length"
    assert result["choices"][0]["text"] == text


async def test_eos_ends_with_stop_and_ignore_eos(make_engine: EngineFactory) -> None:
    async with running(make_config(), make_engine(eos_after=3)) as h:
        result = await _complete(h, prompt="eos", max_tokens=10)
        assert result["choices"][0]["finish_reason"] == "stop"
        assert result["usage"]["completion_tokens"] == 4  # the EOS token counts, its text does not
        assert "<|im_end|>" not in result["choices"][0]["text"]
        kept = await _complete(h, prompt="eos", max_tokens=10, ignore_eos=True)
        assert kept["choices"][0]["finish_reason"] == "length"
        late = await _complete(h, prompt="eos", max_tokens=10, min_tokens=6)
        assert late["usage"]["completion_tokens"] == 7


async def test_stop_token_ids_extra(make_engine: EngineFactory) -> None:
    async with running(make_config(), make_engine(eos_after=2)) as h:
        result = await _complete(h, prompt="x", max_tokens=10, ignore_eos=True,
                                 stop_token_ids=[7])
        assert result["choices"][0]["finish_reason"] == "stop"


async def test_chat_completion(gateway: Harness) -> None:
    response = await gateway.client.post("/v1/chat/completions", json={
        "model": "tiny", "max_completion_tokens": 6, "max_tokens": 99,
        "messages": [{"role": "developer", "content": "be brief"},
                     {"role": "user", "content": [{"type": "text", "text": "hi"},
                                                  {"type": "text", "text": "there"}]}]})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    [choice] = body["choices"]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"]
    assert choice["finish_reason"] == "length"
    rendered = gateway.engine.tokenizer.apply_chat_template(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi\nthere"}],
        tokenize=False, add_generation_prompt=True)
    expected_prompt = len(gateway.engine.tokenizer.encode(rendered, add_special_tokens=False))
    assert body["usage"] == {"prompt_tokens": expected_prompt, "completion_tokens": 6,
                             "total_tokens": expected_prompt + 6,
                             "prompt_tokens_details": {"cached_tokens": 0}}


async def test_chat_without_max_tokens_fills_the_context(gateway: Harness) -> None:
    response = await gateway.client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "ignore_eos": True})
    usage = response.json()["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == MAX_MODEL_LEN


async def test_deadline_ends_with_length(make_engine: EngineFactory) -> None:
    config = make_config(request_timeout_s=0.15)
    async with running(config, make_engine(token_delay_s=0.02)) as h:
        result = await _complete(h, prompt="slow", max_tokens=200)
        assert result["choices"][0]["finish_reason"] == "length"
        assert 0 < result["usage"]["completion_tokens"] < 200
        assert h.fake.abort_reasons["deadline"] == 1 and h.fake.kv_blocks_in_use == 0


class _Job:
    """What `SettlingResponse` reads of a Job: its headers, and `finish` (recorded)."""

    def __init__(self) -> None:
        self.headers = {"x-slicegate-priority": "high"}
        self.finished_at: int | None = None
        self.sent = 0

    def finish(self) -> None:
        self.finished_at = self.sent


async def test_a_json_response_settles_its_job_once_sent_or_when_sending_fails() -> None:
    from typing import cast

    from gateway.completions import SettlingResponse
    from gateway.job import Job

    job = _Job()

    async def send(message: dict) -> None:
        job.sent += 1

    async def receive() -> dict:
        return {"type": "http.disconnect"}

    await SettlingResponse({"ok": True}, cast(Job, job))({"type": "http"}, receive, send)
    assert job.sent == 2 and job.finished_at == 2  # after the headers and the body went out

    failing = _Job()

    async def broken(message: dict) -> None:
        raise OSError("gone")

    with pytest.raises(OSError):
        await SettlingResponse({"ok": True}, cast(Job, failing))({"type": "http"}, receive, broken)
    assert failing.finished_at == 0
