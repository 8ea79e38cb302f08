"""Draining: 503 for new requests while in-flight ones finish; SIGTERM drains and exits 0."""

from __future__ import annotations

import asyncio
import gc
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.state import AppState
from tests.gateway.harness import EngineFactory, make_config, running, sse_events

pytestmark = pytest.mark.asyncio(loop_scope="session")

REPO = Path(__file__).resolve().parents[2]

# NOTE: the same `serve()` that `python -m gateway serve` runs, given a fake engine.
SERVE_FAKE = """
import sys
from gateway.config import GatewayConfig, SchedulerSettings, ServerSettings
from gateway.engine import Engine, eos_ids, load_tokenizer
from gateway.server import serve
from scheduler.testing.fake import FakeConfig, FakeScheduler

tokenizer = load_tokenizer(sys.argv[1])
fake = FakeScheduler(FakeConfig(vocab_size=len(tokenizer), token_delay_s=0.03,
                                token_ids=tuple(range(3, len(tokenizer)))))
engine = Engine(tokenizer, fake, "tiny", 256, len(tokenizer), eos_ids(tokenizer))
config = GatewayConfig(scheduler=SchedulerSettings(devices=("cpu:0",)),
                       server=ServerSettings(port=0, drain_timeout_s=30))
sys.exit(serve(config, engine))
"""


async def test_draining_refuses_new_and_finishes_in_flight(make_engine: EngineFactory) -> None:
    async with running(make_config(), make_engine(token_delay_s=0.01)) as h:
        state: AppState = h.app.state.gateway
        body = {"prompt": "x", "max_tokens": 30, "stream": True}
        in_flight = asyncio.create_task(h.client.post("/v1/completions", json=body))
        while not h.fake.num_requests:
            await asyncio.sleep(0.005)
        state.lifecycle.begin_drain()
        refused = await h.client.post("/v1/completions", json=body)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "5"
        assert refused.json()["error"]["code"] == "draining"
        assert (await h.client.get("/health")).status_code == 503
        assert (await h.client.get("/metrics")).status_code == 200
        events = sse_events((await in_flight).text)
        assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "length"
        assert state.lifecycle.idle


class _Stderr(threading.Thread):
    """Drains a subprocess's stderr, remembering its lines and the port uvicorn bound."""

    def __init__(self, stream: Any) -> None:
        super().__init__(daemon=True)
        self.stream = stream
        self.lines: list[str] = []
        self.port: int | None = None
        self.ready = threading.Event()

    def run(self) -> None:
        for line in self.stream:
            self.lines.append(line)
            match = re.search(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", line)
            if match:
                self.port = int(match.group(1))
                self.ready.set()
        self.ready.set()


async def _stream_all(client: httpx.AsyncClient, n: int, started: asyncio.Event) -> list[str]:
    count = 0

    async def one(i: int) -> str:
        nonlocal count
        body = {"prompt": f"drain {i}", "max_tokens": 40, "stream": True}
        async with client.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
            text = ""
            async for chunk in response.aiter_text():
                if not text:
                    count += 1
                    if count == n:
                        started.set()
                text += chunk
            return text

    return list(await asyncio.gather(*(one(i) for i in range(n))))


async def test_sigterm_drains_twenty_streams_and_exits_0(tiny_model_dir: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-c", SERVE_FAKE, str(tiny_model_dir)], cwd=REPO,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    stderr = _Stderr(proc.stderr)
    stderr.start()
    try:
        assert await asyncio.to_thread(stderr.ready.wait, 60) and stderr.port, stderr.lines
        url = f"http://127.0.0.1:{stderr.port}"
        started = asyncio.Event()
        limits = httpx.Limits(max_connections=50)
        async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as client:
            streams = asyncio.create_task(_stream_all(client, 20, started))
            await asyncio.wait_for(started.wait(), 30)
            proc.send_signal(signal.SIGTERM)
            async with httpx.AsyncClient(base_url=url, timeout=5) as fresh:
                while (await fresh.get("/health")).status_code != 503:
                    await asyncio.sleep(0.02)
                refused = await fresh.post("/v1/completions", json={"prompt": "late"})
                assert refused.status_code == 503
            bodies = await asyncio.wait_for(streams, 30)
        for body in bodies:
            events = sse_events(body)
            assert events[-1] == "[DONE]"
            assert events[-2]["choices"][0]["finish_reason"] == "length"
        assert await asyncio.to_thread(proc.wait, 30) == 0, "".join(stderr.lines)
        stderr.join(5)
        assert not any("Traceback" in line for line in stderr.lines), "".join(stderr.lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            stderr.join(5)
            proc.stderr.close()


async def test_the_startup_heap_is_frozen_while_serving_and_unfrozen_after(
        make_engine: EngineFactory) -> None:
    assert gc.get_freeze_count() == 0
    async with running(make_config(), make_engine()) as h:
        frozen = gc.get_freeze_count()
        assert frozen > 10_000  # the app, the engine, the tokenizer, what the tests loaded
        assert (await h.client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
                ).status_code == 200
        assert gc.get_freeze_count() <= frozen  # nothing new frozen: requests are collectable
    assert gc.get_freeze_count() == 0
