"""loadgen.client: one streaming completion against scripted servers (httpx.MockTransport)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from loadgen.client import CANCELLED, CompletionCall, RequestRecord, stream_completion


def _sse(*chunks: Any, done: bool = True) -> bytes:
    body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks)
    return (body + ("data: [DONE]\n\n" if done else "")).encode()


def _chunk(text: str, finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "text": text, "finish_reason": finish}]}


USAGE = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}}


async def _run(handler: Callable[[httpx.Request], httpx.Response],
               call: CompletionCall | None = None) -> tuple[RequestRecord, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def record_and_handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return handler(request)

    transport = httpx.MockTransport(record_and_handle)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        record = RequestRecord("t", 0, 0.0, 5, 3)
        call = call or CompletionCall("m", "hello", 3, api_key="sk-1", priority=0)
        await stream_completion(client, call, record, time.monotonic())
    return record, seen


async def test_a_full_stream_is_timed_and_counted() -> None:
    body = _sse(_chunk("a"), _chunk("b"), _chunk("c", "length"), USAGE)
    record, seen = await _run(lambda r: httpx.Response(200, content=body))
    assert record.ok and record.status == 200 and record.error is None
    assert record.finish_reason == "length"
    assert (record.prompt_tokens, record.output_tokens, len(record.token_s)) == (5, 3, 3)
    assert record.ttft_s is not None and record.ttft_s >= 0 and record.tpot_s is not None
    sent = json.loads(seen[0].content)
    assert seen[0].url.path == "/v1/completions"
    assert seen[0].headers["authorization"] == "Bearer sk-1"
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
    assert (sent["max_tokens"], sent["min_tokens"], sent["ignore_eos"]) == (3, 3, True)
    assert sent["priority"] == 0 and sent["model"] == "m" and sent["prompt"] == "hello"


def test_dialects() -> None:
    tf = CompletionCall("m", "p", 4, priority=0, dialect="transformers").body()
    assert "min_tokens" not in tf and "priority" not in tf and "ignore_eos" not in tf
    assert json.loads(tf["generation_config"])["min_new_tokens"] == 4
    plain = CompletionCall("m", "p", 4, dialect="openai").body()
    assert "generation_config" not in plain and "min_tokens" not in plain
    assert CompletionCall("m", "p", 4).headers() == {}
    with pytest.raises(ValueError, match="unknown dialect"):
        CompletionCall("m", "p", 4, dialect="tgi")


async def test_http_errors_keep_status_and_message() -> None:
    envelope = {"error": {"message": "rate limited", "type": "x", "param": None, "code": None}}
    record, _ = await _run(lambda r: httpx.Response(429, json=envelope))
    assert not record.ok and record.status == 429 and record.error == "rate limited"
    assert record.error_key == "429" and record.ttft_s is None
    record, _ = await _run(lambda r: httpx.Response(422, text="x" * 1000))
    assert record.error is not None and len(record.error) == 300


async def test_stream_errors() -> None:
    record, _ = await _run(lambda r: httpx.Response(
        200, content=_sse(_chunk("a"), {"error": {"message": "boom"}}, done=False)))
    assert record.error is not None and "boom" in record.error
    assert record.error_key == "stream error" and record.output_tokens == 1
    record, _ = await _run(lambda r: httpx.Response(200, content=_sse(_chunk("a"), done=False)))
    assert record.error == "stream ended before a finish_reason"


async def test_a_stream_may_end_without_done_after_its_finish() -> None:
    # transformers serve: the last chunk holds the finish_reason and the usage, no [DONE]
    last = {**_chunk("", "length"), "usage": {"prompt_tokens": 5, "completion_tokens": 2}}
    record, _ = await _run(lambda r: httpx.Response(
        200, content=_sse(_chunk("a"), _chunk("b"), last, done=False)))
    assert record.ok and record.output_tokens == 2 and len(record.token_s) == 2


async def test_connection_errors_and_timeouts() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    record, _ = await _run(refuse)
    assert record.status == 0 and record.error_key == "ConnectError" and record.end_s is not None
    record, _ = await _run(slow)
    assert record.error_key == "timeout"


async def test_cancelling_marks_the_record() -> None:
    async def forever() -> AsyncIterator[bytes]:
        yield b'data: {"choices": [{"text": "a", "finish_reason": null}]}\n\n'
        await asyncio.sleep(60)

    transport = httpx.MockTransport(lambda r: httpx.Response(200, content=forever()))
    record = RequestRecord("t", 0, 0.0, 1, 1)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        task = asyncio.ensure_future(stream_completion(
            client, CompletionCall("m", "p", 1), record, time.monotonic()))
        while not record.token_s:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert record.error == CANCELLED and record.error_key == "cancelled"
    assert record.output_tokens == 1 and record.end_s is not None
