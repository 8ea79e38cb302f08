"""The overhead probe's timed requests, against the stub served by uvicorn on loopback."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx
import pytest
import uvicorn

from loadgen.client import CompletionCall
from loadgen.leanhttp import LeanConnection
from loadgen.stub import StubConfig, create_stub_app
from loadgen.timed_requests import time_completion, time_health

KEY = "sk-test"


@contextlib.asynccontextmanager
async def stub_server() -> AsyncIterator[int]:
    """The stub app (one 2 ms step per token) on a free loopback port, on this event loop."""
    app = create_stub_app(StubConfig(step_s=0.002, keys={KEY: "t"}))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                           lifespan="on", ws="none"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        await task


async def test_json_and_streaming_completions_on_one_connection() -> None:
    async with stub_server() as port, LeanConnection("127.0.0.1", port) as lean:
        call = CompletionCall("stub", "a b c", 3, KEY)
        streamed = await time_completion(lean, call, stream=True)
        assert streamed.first_s is not None
        # three 2 ms steps: the first token comes after one, the stream ends after three
        assert streamed.send_s < streamed.first_s < streamed.end_s
        assert streamed.end_s - streamed.send_s >= 0.005
        plain = await time_completion(lean, call, stream=False)
        assert plain.first_s is None and plain.end_s - plain.send_s >= 0.005
        assert plain.send_s > streamed.end_s
        assert lean.connects == 1  # the stream was read past [DONE]: keep-alive held


@pytest.mark.parametrize("stream", [True, False])
async def test_a_refused_request_raises(stream: bool) -> None:
    async with stub_server() as port, LeanConnection("127.0.0.1", port) as lean:
        with pytest.raises(RuntimeError, match="HTTP 401: .*invalid API key"):
            await time_completion(lean, CompletionCall("stub", "a", 1, "sk-wrong"), stream)


@contextlib.asynccontextmanager
async def answering(answer: bytes) -> AsyncIterator[LeanConnection]:
    """A lean connection to a server that reads a request's head, writes `answer` and closes."""
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")  # the body is never read: the answer comes first
        writer.write(answer)
        await writer.drain()
        writer.close()

    listener = await asyncio.start_server(serve, "127.0.0.1", 0)
    async with listener, LeanConnection("127.0.0.1", listener.sockets[0].getsockname()[1]) as lean:
        yield lean


async def test_a_stream_without_its_end_raises() -> None:
    token = b'data: {"choices": [{"text": "x", "finish_reason": null}]}\n\n'
    async with answering(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                         + f"{len(token):x}\r\n".encode() + token + b"\r\n0\r\n\r\n") as lean:
        with pytest.raises(RuntimeError, match="stream ended before a finish_reason"):
            await time_completion(lean, CompletionCall("m", "a", 1), stream=True)


async def test_a_broken_connection_raises_a_runtime_error() -> None:
    async with answering(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{") as lean:
        with pytest.raises(RuntimeError, match="JSON request failed: LeanHTTPError"):
            await time_completion(lean, CompletionCall("m", "a", 1), stream=False)


async def test_health_round_trips_alternate_between_the_clients() -> None:
    async with stub_server() as port, LeanConnection("127.0.0.1", port) as lean, \
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        trips = await time_health(client, lean, 4)
        assert len(trips.httpx_s) == len(trips.lean_s) == 4
        assert all(t > 0 for t in trips.httpx_s + trips.lean_s)
        assert lean.connects == 1
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}/x") as elsewhere:
            with pytest.raises(RuntimeError, match="GET /health: HTTP 404"):
                await time_health(elsewhere, lean, 1)
