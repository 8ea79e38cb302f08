"""The access line: written once the response is out, once per request, in uvicorn's format."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.accesslog import AccessLogMiddleware
from tests.serve import GatewayProcess

SCOPE: Scope = {"type": "http", "method": "POST", "path": "/v1/completions", "query_string": b"",
                "http_version": "1.1", "client": ("127.0.0.1", 5000), "headers": []}


class Recorder(logging.Handler):
    """Keeps each access record, in order with the messages sent (`events`)."""

    def __init__(self, events: list[str]) -> None:
        super().__init__()
        self.events = events

    def emit(self, record: logging.LogRecord) -> None:
        self.events.append(f"log {record.getMessage()}")


@pytest.fixture
def events() -> Iterator[list[str]]:
    logger = logging.getLogger("uvicorn.access")
    seen: list[str] = []
    handler, level = Recorder(seen), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield seen
    logger.removeHandler(handler)
    logger.setLevel(level)


def app_sending(*messages: Message, then_raise: bool = False) -> ASGIApp:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        for m in messages:
            await send(m)
        if then_raise:
            raise RuntimeError("boom")
    return app


async def run(app: ASGIApp, events: list[str]) -> None:
    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        events.append(f"send {message['type']}")

    await AccessLogMiddleware(app)(dict(SCOPE), receive, send)


async def test_the_line_follows_the_last_byte_of_the_response(events: list[str]) -> None:
    app = app_sending({"type": "http.response.start", "status": 200, "headers": []},
                      {"type": "http.response.body", "body": b"a", "more_body": True},
                      {"type": "http.response.body", "body": b"b"})
    await run(app, events)
    assert events == ["send http.response.start", "send http.response.body",
                      "send http.response.body",
                      'log 127.0.0.1:5000 - "POST /v1/completions HTTP/1.1" 200']


async def test_a_response_cut_by_an_error_is_logged_and_the_error_goes_on(
        events: list[str]) -> None:
    app = app_sending({"type": "http.response.start", "status": 500, "headers": []},
                      then_raise=True)
    with pytest.raises(RuntimeError, match="boom"):
        await run(app, events)
    assert events[-1] == ('log 127.0.0.1:5000 - "POST /v1/completions HTTP/1.1" 500 '
                          'error: (no response body)')


async def test_no_response_no_line(events: list[str]) -> None:
    with pytest.raises(RuntimeError):
        await run(app_sending(then_raise=True), events)
    assert events == []


async def test_a_logger_above_info_writes_nothing(events: list[str]) -> None:
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)
    await run(app_sending({"type": "http.response.start", "status": 200, "headers": []},
                          {"type": "http.response.body", "body": b""}), events)
    assert events == ["send http.response.start", "send http.response.body"]


def test_the_real_server_writes_one_line_per_request(tmp_path: Path) -> None:
    with GatewayProcess(["--model", "tiny-random", "--dtype", "float32",
                         "--device-memory-gib", "0.25", "--log-level", "info"],
                        tmp_path / "server.log") as server:
        before = server.log()
        done = httpx.post(f"{server.url}/v1/completions", timeout=60,
                          json={"model": "tiny-random", "prompt": "Hello", "max_tokens": 2})
        missing = httpx.get(f"{server.url}/v1/nothing-here", timeout=10)
        assert (done.status_code, missing.status_code) == (200, 404)
        deadline = time.monotonic() + 10  # NOTE: the line may follow the response by a moment
        while time.monotonic() < deadline and '/v1/nothing-here' not in server.log():
            time.sleep(0.05)
        time.sleep(0.2)  # a second line, were one written, would be written by now
        lines = server.log()[len(before):].splitlines()
    posts = [ln for ln in lines if re.search(r'"POST /v1/completions HTTP/1.1" 200\b', ln)]
    gets = [ln for ln in lines if re.search(r'"GET /v1/nothing-here HTTP/1.1" 404\b', ln)]
    assert (len(posts), len(gets)) == (1, 1), lines
