"""SSE streams: chunk shapes, [DONE], include_usage, stop strings, mid-stream errors."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from tests.gateway.harness import EngineFactory, Harness, make_config, running, sse_events

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def _stream(h: Harness, path: str = "/v1/completions", **body: Any) -> list[Any]:
    response = await h.client.post(path, json={"stream": True, **body})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    return events[:-1]


def _text(events: list[Any]) -> str:
    return "".join(e["choices"][0].get("text", "") for e in events if e["choices"])


async def test_completion_stream(gateway: Harness) -> None:
    events = await _stream(gateway, prompt="Hello", max_tokens=6, seed=1)
    assert all(e["object"] == "text_completion" and "usage" not in e for e in events)
    assert len({e["id"] for e in events}) == 1
    assert [e["choices"][0]["finish_reason"] for e in events][-1] == "length"
    assert all(e["choices"][0]["finish_reason"] is None for e in events[:-1])
    full = (await gateway.client.post("/v1/completions", json={
        "prompt": "Hello", "max_tokens": 6, "seed": 1})).json()["choices"][0]["text"]
    assert _text(events) == full


async def test_include_usage(gateway: Harness) -> None:
    events = await _stream(gateway, prompt="Hello", max_tokens=4,
                           stream_options={"include_usage": True})
    *chunks, last = events
    assert all(e["usage"] is None for e in chunks)
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 4


async def test_chat_stream(gateway: Harness) -> None:
    events = await _stream(gateway, "/v1/chat/completions", max_tokens=5,
                           messages=[{"role": "user", "content": "hi"}])
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = "".join(e["choices"][0]["delta"].get("content", "") for e in events[1:])
    assert content and events[-1]["choices"][0]["finish_reason"] == "length"


async def test_stream_stop_string_never_leaked(gateway: Harness) -> None:
    full = _text(await _stream(gateway, prompt="leak", max_tokens=60, seed=9))
    for start, width in ((5, 1), (20, 3), (31, 6)):
        stop = full[start:start + width]
        events = await _stream(gateway, prompt="leak", max_tokens=60, seed=9, stop=stop)
        pieces = [e["choices"][0]["text"] for e in events]
        assert "".join(pieces) == full[:full.find(stop)]
        assert events[-1]["choices"][0]["finish_reason"] == "stop"
        assert all(stop not in p for p in pieces)
    assert gateway.fake.kv_blocks_in_use == 0


async def test_several_prompts_stream_by_index(gateway: Harness) -> None:
    events = await _stream(gateway, prompt=["one", "two"], max_tokens=3)
    finished = [e["choices"][0]["index"] for e in events if e["choices"][0]["finish_reason"]]
    assert sorted(finished) == [0, 1]


async def test_error_mid_stream(make_engine: EngineFactory) -> None:
    async with running(make_config(), make_engine(error_after=2)) as h:
        events = await _stream(h, prompt="boom", max_tokens=10)
        assert events[-1]["error"]["type"] == "server_error"
        assert "injected error" in events[-1]["error"]["message"]
        response = await h.client.post("/v1/completions", json={"prompt": "boom"})
        assert response.status_code == 500
        assert response.json()["error"]["code"] == "generation_error"
        assert h.fake.kv_blocks_in_use == 0


async def _body_messages(h: Harness, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The `http.response.body` messages the app sends for one POST /v1/completions."""
    raw = orjson.dumps(body)
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/completions",
             "raw_path": b"/v1/completions", "query_string": b"", "root_path": "",
             "headers": [(b"host", b"gateway"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(raw)).encode())],
             "client": ("127.0.0.1", 1), "server": ("gateway", 80)}
    requests = [{"type": "http.request", "body": raw, "more_body": False}]
    sent: list[dict[str, Any]] = []
    done = asyncio.Event()

    async def receive() -> dict[str, Any]:
        if requests:
            return requests.pop(0)
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            done.set()

    await h.app(scope, receive, send)
    return [m for m in sent if m["type"] == "http.response.body"]


@pytest.mark.parametrize("usage", [False, True])
async def test_the_last_chunk_and_done_end_the_response_in_one_message(
        gateway: Harness, usage: bool) -> None:
    body = {"prompt": "Hello", "max_tokens": 3, "stream": True,
            "stream_options": {"include_usage": usage}}
    messages = await _body_messages(gateway, body)
    *tokens, last = messages
    assert last["more_body"] is False  # NOTE: no empty message after [DONE]
    assert all(m["more_body"] for m in tokens)
    events = sse_events(last["body"].decode())
    assert events[-1] == "[DONE]"
    assert events[0]["choices"][0]["finish_reason"] == "length"
    assert ("usage" in events[1]) is usage and len(events) == 2 + usage
    assert all(sse_events(m["body"].decode())[0]["choices"][0]["finish_reason"] is None
               for m in tokens)


async def test_each_choice_still_ends_in_its_own_chunk(gateway: Harness) -> None:
    events = await _stream(gateway, prompt=["one", "two"], max_tokens=2)
    finishes = [(e["choices"][0]["index"], e["choices"][0]["finish_reason"]) for e in events]
    assert sorted(f for f in finishes if f[1] is not None) == [(0, "length"), (1, "length")]
