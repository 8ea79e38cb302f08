"""The log format (text and JSON, uvicorn's lines included) and one line per failed request."""

from __future__ import annotations

import io
import json
import logging
import logging.config
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.types import Message, Receive, Scope, Send

from gateway.accesslog import AccessLogMiddleware
from gateway.errors import ErrorMiddleware
from gateway.logs import (
    OWN_LOGGERS,
    JsonFormatter,
    RequestFields,
    TextFormatter,
    begin_request,
    configure_logging,
    end_request,
    note_request,
    uvicorn_log_config,
)
from models import native
from tests.gateway.harness import TENANTS_YAML
from tests.serve import GatewayProcess

FORGED = "2026-01-01T00:00:00.000+00:00 INFO gateway: a forged line"
STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d"
TEXT_LINE = re.compile(rf"^{STAMP} (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: .*$")
TINY = ["--model", "tiny-random", "--dtype", "float32", "--device-memory-gib", "0.25"]


def record(msg: str = "hello %s", *args: object, **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord("scheduler.cost.colearn", logging.INFO, __file__, 1, msg,
                            args or ("world",), None)
    rec.__dict__.update(extra)
    return rec


def test_a_text_line_has_timestamp_level_logger_and_message() -> None:
    line = TextFormatter().format(record())
    assert TEXT_LINE.match(line), line
    assert line.endswith(" INFO scheduler.cost.colearn: hello world")


def test_a_json_line_has_the_fields_and_the_extras() -> None:
    line = json.loads(JsonFormatter().format(record(tenant="ide", status=400)))
    assert line.pop("ts")
    assert line == {"level": "INFO", "logger": "scheduler.cost.colearn", "msg": "hello world",
                    "tenant": "ide", "status": 400}


def test_a_json_line_keeps_its_traceback_on_the_line() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        rec = record()
        rec.exc_info = sys.exc_info()
    out = JsonFormatter().format(rec)
    assert "\n" not in out
    assert "RuntimeError: boom" in json.loads(out)["exc"]


def test_a_line_written_during_a_request_carries_its_noted_fields() -> None:
    fields, token = begin_request()
    try:
        assert note_request(tenant="chat", request_id="r1")
        rec = record()
        RequestFields().filter(rec)
    finally:
        end_request(token)
    assert (rec.tenant, rec.request_id) == ("chat", "r1")  # type: ignore[attr-defined]
    assert not note_request(tenant="outside")  # no request: nothing to note


@pytest.fixture
def logged() -> Iterator[io.StringIO]:
    """The root logger configured as the server does (JSON), into a buffer; put back after."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    own = {name: logging.getLogger(name).level for name in OWN_LOGGERS}
    out = io.StringIO()
    handler = configure_logging("info", "json", out)
    yield out
    root.removeHandler(handler)
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, was in own.items():
        logging.getLogger(name).setLevel(was)
    logging.captureWarnings(False)


def test_debug_is_for_slicegate_s_loggers_only(logged: io.StringIO) -> None:
    configure_logging("debug", "json", logged)
    logging.getLogger("scheduler.cost.colearn").debug("co-location slowdowns learnt")
    logging.getLogger("asyncio").debug("Using selector: EpollSelector")
    logging.getLogger("asyncio").info("a library's INFO line")
    lines = [json.loads(ln)["msg"] for ln in logged.getvalue().splitlines()]
    assert lines == ["co-location slowdowns learnt", "a library's INFO line"]


def test_uvicorn_loggers_propagate_into_the_one_format(logged: io.StringIO) -> None:
    uvicorn_error = logging.getLogger("uvicorn.error")
    was = uvicorn_error.level  # NOTE: a LiveServer test before this one left its log_level
    uvicorn_error.setLevel(logging.NOTSET)
    try:
        logging.config.dictConfig(uvicorn_log_config())
        uvicorn_error.info("Uvicorn running on %s", "http://x")
    finally:
        uvicorn_error.setLevel(was)
    line = json.loads(logged.getvalue())
    assert (line["logger"], line["msg"]) == ("uvicorn.error", "Uvicorn running on http://x")


async def test_a_500_is_one_error_line_with_its_traceback(logged: io.StringIO) -> None:
    async def broken(scope: Scope, receive: Receive, send: Send) -> None:
        note_request(tenant="chat")
        raise RuntimeError("boom")

    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    scope: Scope = {"type": "http", "method": "GET", "path": "/x", "query_string": b"",
                    "http_version": "1.1", "client": ("127.0.0.1", 1), "headers": []}
    await AccessLogMiddleware(ErrorMiddleware(broken))(scope, receive, send)
    assert sent[0]["status"] == 500
    (line,) = [json.loads(ln) for ln in logged.getvalue().splitlines()]
    assert (line["level"], line["status"], line["tenant"]) == ("ERROR", 500, "chat")
    assert "internal_error: Internal server error" in line["msg"]
    assert "RuntimeError: boom" in line["exc"]
    assert line["request_id"] in line["msg"]


def failed_lines(log: str, path: str) -> list[str]:
    return [ln for ln in log.splitlines() if f" {path} HTTP/1.1" in ln]


def wait_for(server: GatewayProcess, text: str) -> str:
    deadline = time.monotonic() + 10  # NOTE: the line follows the response by a moment
    while time.monotonic() < deadline and text not in server.log():
        time.sleep(0.05)
    time.sleep(0.2)  # a second line, were one written, would be written by now
    return server.log()


def test_the_real_server_writes_every_line_in_one_text_format(tmp_path: Path) -> None:
    with GatewayProcess([*TINY, "--log-level", "info"], tmp_path / "server.log") as server:
        got = httpx.post(f"{server.url}/v1/completions", timeout=30,
                         json={"model": "nope", "prompt": "Hi"})
        log = wait_for(server, "model_not_found")
    assert got.status_code == 404
    assert "\r" not in log  # no progress bars into a file
    lines = log.splitlines()
    assert [ln for ln in lines if not TEXT_LINE.match(ln)] == []
    assert any(" INFO uvicorn.error: Uvicorn running on " in ln for ln in lines)
    (line,) = failed_lines(log, "/v1/completions")
    assert " WARNING uvicorn.access: " in line
    assert "404 model_not_found: The model 'nope' does not exist" in line
    assert f"request_id={got.headers['x-request-id']}" in line


def test_json_lines_name_the_reason_tenant_and_request_of_each_failure(
        tmp_path: Path) -> None:
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(TENANTS_YAML)
    args = [*TINY, "--tenants", str(tenants), "--log-format", "json"]
    with GatewayProcess(args, tmp_path / "server.log") as server:
        bad = httpx.post(f"{server.url}/v1/completions", timeout=30,
                         headers={"Authorization": "Bearer sk-chat-1"},
                         json={"model": "tiny-random", "prompt": "Hi", "max_tokens": -3})
        anonymous = httpx.post(f"{server.url}/v1/chat/completions", timeout=30,
                               headers={"Authorization": "Bearer sk-wrong"}, json={})
        log = wait_for(server, "/v1/chat/completions")
    assert (bad.status_code, anonymous.status_code) == (400, 401)
    lines = [json.loads(ln) for ln in log.splitlines()]
    assert all({"ts", "level", "logger", "msg"} <= set(ln) for ln in lines)
    assert any(ln["logger"] == "uvicorn.error" for ln in lines)
    (first,) = [ln for ln in lines if ln.get("path") == "/v1/completions"]
    assert (first["status"], first["tenant"], first["level"]) == (400, "chat", "WARNING")
    assert first["request_id"] == bad.headers["x-request-id"]
    assert first["reason"] == bad.json()["error"]["message"] and "max_tokens" in first["reason"]
    (second,) = [ln for ln in lines if ln.get("path") == "/v1/chat/completions"]
    assert (second["status"], second["error_code"]) == (401, "invalid_api_key")
    assert "tenant" not in second  # an unknown key names no tenant


STEPS = ("models.loader: loading model tiny-random from ",
         "models.tuning: measuring the fastest CPU kernels on ",
         "models.warmup: warming the GEMMs at ",
         "scheduler.cost.profiling: profiling the operators of tiny-random on cpu:0, cpu:1")


def test_a_first_start_logs_each_long_step_as_it_begins_and_ends(tmp_path: Path) -> None:
    env = {"SLICEGATE_CACHE": str(tmp_path / "cache")}  # nothing measured or profiled yet
    with GatewayProcess(TINY, tmp_path / "server.log", env=env) as server:
        log = server.log()
    assert "\r" not in log
    lines = log.splitlines()
    compiles = ("models.native: compiling the native library kernels for this CPU",)
    for step in STEPS + (compiles if native.library() is not None else ()):
        begins = [ln for ln in lines if step in ln and ln.endswith(" ...")]
        ends = [ln for ln in lines if step in ln and re.search(r": done in \d+\.\d s", ln)]
        assert (len(begins), len(ends)) == (1, 1), (step, lines)
        assert lines.index(begins[0]) < lines.index(ends[0])
    ready = next(i for i, ln in enumerate(lines) if "Uvicorn running on" in ln)
    assert all(lines.index(ln) < ready for ln in lines if ": done in " in ln)


async def test_a_reason_with_a_line_break_cannot_forge_a_line(logged: io.StringIO) -> None:
    async def not_found(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 404, "headers": []})
        body = {"error": {"message": f"no such path\n{FORGED}"}}
        await send({"type": "http.response.body", "body": json.dumps(body).encode()})

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        pass

    scope: Scope = {"type": "http", "method": "GET", "path": "/x", "query_string": b"",
                    "http_version": "1.1", "client": ("127.0.0.1", 1), "headers": []}
    text = io.StringIO()
    configure_logging("info", "text", text)  # NOTE: `logged` puts the handlers back
    await AccessLogMiddleware(not_found)(scope, receive, send)
    (line,) = text.getvalue().splitlines()
    assert line.endswith(f"404 error: no such path\\n{FORGED}")
