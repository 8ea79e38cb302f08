"""The real `python -m gateway serve` process on the tiny model, driven by the openai client."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.gateway.harness import ADMIN, tiny_server_args
from tests.serve import GatewayProcess

pytestmark = pytest.mark.asyncio(loop_scope="session")


class Server(GatewayProcess):
    """The gateway on the tiny model; tenant nightly does not share the prefix cache."""

    def __init__(self, tmp: Path) -> None:
        super().__init__(tiny_server_args(tmp, ide={"ttft_slo_ms": 2000},
                                          nightly={"share_prefix_cache": False}),
                         tmp / "server.log")

    def kv_blocks_used(self) -> int:
        gmg = httpx.get(f"{self.url}/admin/gmg", headers=ADMIN, timeout=5).json()
        return sum(d["kv_blocks_used"] for d in gmg["devices"])


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    s = Server(tmp_path)
    try:
        yield s
    finally:
        s.close()


async def test_openai_clients_sync_async_streaming(server: Server) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="sk-ide-1", max_retries=0)
    done = client.completions.create(model="tiny-random", prompt="Hello there", max_tokens=6,
                                     temperature=0, extra_body={"ignore_eos": True})
    assert done.usage is not None and done.usage.completion_tokens == 6
    streamed = client.completions.create(model="tiny-random", prompt="Hello there",
                                         max_tokens=6, temperature=0, stream=True,
                                         extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in streamed) == done.choices[0].text
    aclient = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="sk-nightly-1",
                                 max_retries=0)
    raw = await aclient.chat.completions.with_raw_response.create(
        model="tiny-random", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
        extra_body={"priority": 0})
    assert raw.headers["x-slicegate-priority"] == "low"  # cannot be raised above the tenant's
    chunks = [c async for c in await aclient.chat.completions.create(
        model="tiny-random", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
        stream=True, stream_options={"include_usage": True})]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens <= 4
    client.close()
    await aclient.close()


async def test_cached_tokens_through_the_openai_client(server: Server) -> None:
    ide = openai.OpenAI(base_url=f"{server.url}/v1", api_key="sk-ide-1", max_retries=0)
    nightly = openai.OpenAI(base_url=f"{server.url}/v1", api_key="sk-nightly-1", max_retries=0)
    prompt = "the same long system prompt, " * 12

    def cached(client: openai.OpenAI, stream: bool = False) -> int:
        if stream:
            chunks = list(client.completions.create(
                model="tiny-random", prompt=prompt, max_tokens=3, stream=True,
                stream_options={"include_usage": True}))
            used = chunks[-1].usage
        else:
            used = client.completions.create(model="tiny-random", prompt=prompt,
                                             max_tokens=3).usage
        assert used is not None and used.prompt_tokens_details is not None
        assert used.prompt_tokens_details.cached_tokens is not None
        return used.prompt_tokens_details.cached_tokens

    assert cached(ide) == 0  # 0, not absent, when nothing was reused
    hit = cached(ide)
    assert hit > 0 and hit % 16 == 0
    assert cached(ide, stream=True) == hit
    assert cached(nightly) == 0  # its blocks are its own, and it sees none of ide's
    assert cached(nightly, stream=True) == hit
    assert cached(ide) == hit
    metrics = httpx.get(f"{server.url}/metrics", timeout=5).text
    assert 'vllm:prefix_cache_hits_total{model_name="tiny-random",priority="high",' \
           f'tenant="ide"}} {3.0 * hit}' in metrics
    assert 'slicegate_prefix_cache_hit_rate{tenant="ide"}' in metrics
    ide.close()
    nightly.close()


async def test_two_hundred_aborted_streams_leave_no_kv(server: Server) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30,
                                 limits=httpx.Limits(max_connections=50)) as client:
        async def one(i: int) -> None:
            body = {"model": "tiny-random", "prompt": f"abort me {i}", "max_tokens": 500,
                    "stream": True, "ignore_eos": True}
            async with client.stream("POST", "/v1/completions", json=body,
                                     headers={"Authorization": "Bearer sk-nightly-1"}) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        return  # disconnect after the first token
        for k in range(0, 200, 50):
            await asyncio.gather(*(one(i) for i in range(k, k + 50)))
    deadline = time.monotonic() + 30
    while server.kv_blocks_used() and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert server.kv_blocks_used() == 0


async def test_sigterm_finishes_twenty_streams_and_exits_0(server: Server) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=60,
                                 limits=httpx.Limits(max_connections=30)) as client:
        started = asyncio.Semaphore(0)

        async def one(i: int) -> str:
            body = {"model": "tiny-random", "prompt": f"drain {i}", "max_tokens": 40,
                    "stream": True, "ignore_eos": True}
            text = ""
            async with client.stream("POST", "/v1/completions", json=body,
                                     headers={"Authorization": "Bearer sk-ide-1"}) as r:
                async for line in r.aiter_lines():
                    if not text:
                        started.release()
                    text += line + "\n"
            return text

        tasks = [asyncio.create_task(one(i)) for i in range(20)]
        for _ in range(20):
            await asyncio.wait_for(started.acquire(), 60)
        server.proc.send_signal(signal.SIGTERM)
        bodies = await asyncio.wait_for(asyncio.gather(*tasks), 60)
    assert all(b.rstrip().endswith("data: [DONE]") for b in bodies)
    assert all('"finish_reason":"length"' in b for b in bodies)
    assert await asyncio.to_thread(server.proc.wait, 60) == 0
