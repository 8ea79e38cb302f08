"""Every error path answers with the OpenAI envelope and the right status (never 422)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from scheduler.api import Overloaded, Request, TokenEvent
from scheduler.testing.fake import FakeScheduler
from tests.gateway.harness import (
    MAX_MODEL_LEN,
    MODEL,
    EngineFactory,
    Harness,
    auth_config,
    make_config,
    running,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")

CHAT = [{"role": "user", "content": "hi"}]


def _error(response: httpx.Response, status: int, param: str | None = None,
           code: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    return error


async def test_malformed_json_and_non_object(gateway: Harness) -> None:
    for raw in (b"{not json", b"[1, 2]", b"", b'"text"'):
        response = await gateway.client.post("/v1/completions", content=raw,
                                             headers={"content-type": "application/json"})
        _error(response, 400, code="invalid_json")


@pytest.mark.parametrize(("body", "param"), [
    ({"prompt": "x", "max_tokens": "16"}, "max_tokens"),
    ({"prompt": "x", "max_tokens": True}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 2.5}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "temperature": "hot"}, "temperature"),
    ({"prompt": "x", "temperature": -1}, "temperature"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "top_k": -2}, "top_k"),
    ({"prompt": "x", "seed": "1"}, "seed"),
    ({"prompt": "x", "stream": "yes"}, "stream"),
    ({"prompt": "x", "stop": 5}, "stop"),
    ({"prompt": "x", "stop": ["a", 1]}, "stop"),
    ({"prompt": "x", "ignore_eos": 1}, "ignore_eos"),
    ({"prompt": "x", "min_tokens": 20, "max_tokens": 10}, "min_tokens"),
    ({"prompt": "x", "priority": "high"}, "priority"),
    ({"prompt": "x", "service_tier": "scale"}, "service_tier"),
    ({"prompt": "x", "user": 7}, "user"),
    ({"prompt": "x", "model": 3}, "model"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
    ({"prompt": "x", "stream": True, "stream_options": {"include_usage": "y"}},
     "stream_options.include_usage"),
    ({"prompt": 42}, "prompt"),
    ({"prompt": [1, "a"]}, "prompt"),
    ({"prompt": [-1]}, "prompt"),
    ({"prompt": [[1], 2.5]}, "prompt[1]"),
    ({"prompt": ["a", 3]}, "prompt"),
    ({"prompt": [10**9]}, "prompt"),
])
async def test_wrong_types_and_values(gateway: Harness, body: dict[str, Any], param: str) -> None:
    _error(await gateway.client.post("/v1/completions", json=body), 400, param)


@pytest.mark.parametrize(("body", "param"), [
    ({}, "prompt"), ({"prompt": None}, "prompt"), ({"prompt": ""}, "prompt"),
    ({"prompt": []}, "prompt"), ({"prompt": [[]]}, "prompt"), ({"prompt": ["a", ""]}, "prompt[1]"),
])
async def test_empty_prompt(gateway: Harness, body: dict[str, Any], param: str) -> None:
    _error(await gateway.client.post("/v1/completions", json=body), 400, param)


@pytest.mark.parametrize(("body", "param"), [
    ({}, "messages"), ({"messages": []}, "messages"), ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
    ({"messages": [{"role": "function", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]},
     "messages[0].content[0].text"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}]},
     "messages[0].tool_calls[0].function"),
    ({"messages": CHAT, "tools": [{"type": "function"}]}, "tools[0].function"),
    ({"messages": CHAT, "tool_choice": "required"}, "tool_choice"),
    ({"messages": CHAT, "max_completion_tokens": "9"}, "max_completion_tokens"),
])
async def test_bad_chat_bodies(gateway: Harness, body: dict[str, Any], param: str) -> None:
    _error(await gateway.client.post("/v1/chat/completions", json=body), 400, param)


@pytest.mark.parametrize(("field", "value"), [
    ("best_of", 3), ("suffix", "end"), ("prompt_logprobs", 2),
    ("use_beam_search", True),
])
async def test_unsupported_completion_fields(gateway: Harness, field: str, value: Any) -> None:
    response = await gateway.client.post("/v1/completions", json={"prompt": "x", field: value})
    error = _error(response, 400, field, "unsupported_parameter")
    assert field in error["message"]


@pytest.mark.parametrize(("field", "value"), [
    ("function_call", {"name": "f"}), ("functions", [{"name": "f"}]), ("prompt_logprobs", 1),
    ("audio", {"voice": "x"}),
    ("modalities", ["text", "audio"]), ("best_of", 2), ("reasoning_effort", "high"),
])
async def test_unsupported_chat_fields(gateway: Harness, field: str, value: Any) -> None:
    response = await gateway.client.post("/v1/chat/completions",
                                         json={"messages": CHAT, field: value})
    _error(response, 400, field, "unsupported_parameter")


async def test_defaults_of_unsupported_fields_and_unknown_fields_pass(gateway: Harness) -> None:
    response = await gateway.client.post("/v1/chat/completions", json={
        "messages": CHAT, "max_tokens": 2, "n": 1, "presence_penalty": 0, "logprobs": False,
        "tools": [], "tool_choice": "none", "response_format": {"type": "text"},
        "frequency_penalty": 0.0, "logit_bias": {}, "store": True, "metadata": {"a": "b"},
        "some_future_field": {"x": [1, 2]}, "stream": False, "user": "u1"})
    assert response.status_code == 200, response.text


async def test_context_limit(gateway: Harness) -> None:
    too_long = [5] * MAX_MODEL_LEN
    _error(await gateway.client.post("/v1/completions", json={"prompt": too_long}), 400,
           "prompt", "context_length_exceeded")
    error = _error(await gateway.client.post("/v1/completions", json={
        "prompt": [5] * 200, "max_tokens": 100}), 400, "max_tokens", "context_length_exceeded")
    assert "300" in error["message"]
    _error(await gateway.client.post("/v1/chat/completions", json={
        "messages": CHAT, "max_tokens": MAX_MODEL_LEN}), 400, "max_tokens")
    ok = await gateway.client.post("/v1/completions", json={"prompt": [5] * 250,
                                                            "max_tokens": 6})
    assert ok.status_code == 200


async def test_echo_is_bounded(gateway: Harness) -> None:
    response = await gateway.client.post("/v1/completions",
                                         json={"prompt": "x", "max_tokens": "9" * 5000})
    assert len(_error(response, 400, "max_tokens")["message"]) < 400


async def test_auth_and_model(make_engine: EngineFactory) -> None:
    async with running(auth_config(), make_engine()) as h:
        body = {"prompt": "x", "max_tokens": 1}
        _error(await h.client.post("/v1/completions", json=body), 401, code="invalid_api_key")
        bad = {"authorization": "Bearer sk-nope"}
        _error(await h.client.post("/v1/completions", json=body, headers=bad), 401)
        _error(await h.client.get("/v1/models", headers=bad), 401)
        good = {"authorization": "Bearer sk-ide-1"}
        response = await h.client.post("/v1/completions", json={**body, "model": "gpt-4"},
                                       headers=good)
        _error(response, 404, "model", "model_not_found")
        assert (await h.client.post("/v1/completions", json=body, headers=good)).status_code == 200


async def test_routes_and_methods_use_the_envelope(gateway: Harness) -> None:
    _error(await gateway.client.get("/v1/nothing"), 404)
    _error(await gateway.client.get("/v1/completions"), 405)


async def test_scheduler_refusals(make_engine: EngineFactory) -> None:
    engine = make_engine(max_model_len=64, max_running=1, max_waiting_per_class=1,
                         token_delay_s=0.02)
    async with running(make_config(), engine) as h:
        too_big = await h.client.post("/v1/completions", json={"prompt": [5] * 60,
                                                               "max_tokens": 10})
        _error(too_big, 400, "prompt", "request_too_large")
        post = h.client.post
        first = asyncio.create_task(post("/v1/completions", json={"prompt": "a", "max_tokens": 10}))
        while not h.fake.stats().num_running:
            await asyncio.sleep(0.005)
        second = asyncio.create_task(post("/v1/completions", json={"prompt": "b",
                                                                   "max_tokens": 10}))
        while not h.fake.stats().num_waiting:
            await asyncio.sleep(0.005)
        overloaded = await post("/v1/completions", json={"prompt": "c", "max_tokens": 10})
        assert overloaded.headers["retry-after"] == "1"
        assert (await first).status_code == (await second).status_code == 200
        _error(overloaded, 503, code="overloaded")
        assert h.fake.kv_blocks_in_use == 0


async def test_internal_error_is_500_and_server_keeps_serving(
        make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = make_engine()
    async with running(make_config(), engine, raise_app_exceptions=False) as h:
        def broken(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("kaboom")

        monkeypatch.setattr(h.fake, "snapshot", broken)
        response = await h.client.get("/admin/gmg")
        error = _error(response, 500, code="internal_error")
        assert response.headers["x-request-id"] in error["message"]
        assert "kaboom" not in error["message"]
        ok = await h.client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert ok.status_code == 200


class _LazyRefusal(FakeScheduler):
    """A scheduler that refuses only when its stream is first read."""

    def submit(self, request: Request) -> AsyncIterator[TokenEvent]:
        async def refuse() -> AsyncIterator[TokenEvent]:
            raise Overloaded("queue full", retry_after_s=2.0)
            yield  # an async generator

        return refuse()


async def test_lazy_scheduler_refusal(make_engine: EngineFactory) -> None:
    engine = dataclasses.replace(make_engine(), scheduler=_LazyRefusal())
    async with running(make_config(), engine) as h:
        response = await h.client.post("/v1/completions", json={"prompt": "x"})
        assert _error(response, 503, code="overloaded") and response.headers["retry-after"] == "2"
        # a stream's 200 goes out with its first token: a refusal before it is a plain 503
        stream = await h.client.post("/v1/completions", json={"prompt": "x", "stream": True})
        assert _error(stream, 503, code="overloaded") and stream.headers["retry-after"] == "2"


async def test_bodies_over_the_limit_get_413(make_engine: EngineFactory) -> None:
    body = b'{"model": "m", "prompt": "' + b"x" * 2000 + b'"}'

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it arrives
        for i in range(0, len(body), 500):
            yield body[i:i + 500]

    async with running(make_config(max_body_bytes=1000), make_engine()) as h:
        for content in (body, chunks()):
            response = await h.client.post("/v1/completions", content=content,
                                           headers={"content-type": "application/json"})
            _error(response, 413, code="request_too_large")
        small = await h.client.post("/v1/completions", json={"model": MODEL, "prompt": "hi",
                                                             "max_tokens": 2})
        assert small.status_code == 200, small.text
