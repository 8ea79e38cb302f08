"""End to end on loopback: the official openai client, and client disconnects.

The real uvicorn server runs in a thread (`LiveServer`) over a FakeScheduler.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import httpx
import openai
import pytest

from tests.gateway.harness import EngineFactory, LiveServer, auth_config, live_server

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.fixture
def live(make_engine: EngineFactory) -> Iterator[LiveServer]:
    with live_server(auth_config(), make_engine(token_delay_s=0.002)) as server:
        yield server


def _wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


async def test_openai_sync_client(live: LiveServer) -> None:
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="sk-ide-1", max_retries=0)
    completion = client.completions.create(model="tiny", prompt="Hello", max_tokens=5, seed=1)
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens == 5
    stream = client.completions.create(model="tiny", prompt="Hello", max_tokens=5, seed=1,
                                       stream=True)
    assert "".join(c.choices[0].text for c in stream) == completion.choices[0].text
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].message.content
    chunks = list(client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True,
        stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == chat.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
    assert [m.id for m in client.models.list()] == ["tiny"]
    client.close()


async def test_openai_async_client(live: LiveServer) -> None:
    client = openai.AsyncOpenAI(base_url=f"{live.url}/v1", api_key="sk-ide-1", max_retries=0)
    chat = await client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
        extra_headers={"X-Priority": "low"})
    assert chat.usage is not None and chat.usage.completion_tokens == 3
    raw = await client.completions.with_raw_response.create(
        model="tiny", prompt="x", max_tokens=2, extra_body={"priority": 2})
    assert raw.headers["x-slicegate-priority"] == "low"
    stream = await client.completions.create(model="tiny", prompt="Hello", max_tokens=6,
                                             stream=True, stop=["zzz"])
    reasons = [c.choices[0].finish_reason async for c in stream]
    assert reasons[-1] == "length"
    await client.close()


async def test_openai_client_errors(live: LiveServer) -> None:
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="sk-ide-1", max_retries=0)
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model="tiny", prompt="x", n=2, best_of=3)
    assert bad.value.param == "best_of" and bad.value.code == "unsupported_parameter"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="x")
    with (pytest.raises(openai.AuthenticationError),
          openai.OpenAI(base_url=f"{live.url}/v1", api_key="nope", max_retries=0) as bad_key):
        bad_key.models.list()
    client.close()


async def test_tokenize_detokenize_version(live: LiveServer) -> None:
    key = {"Authorization": "Bearer sk-ide-1"}
    with httpx.Client(base_url=live.url, headers=key, timeout=10) as client:
        text = "héllo, wörld"
        tokenized = client.post("/tokenize", json={"model": "tiny", "prompt": text}).json()
        assert tokenized["count"] == len(tokenized["tokens"]) > 0
        assert tokenized["token_strs"] is None and tokenized["max_model_len"] == 256
        back = client.post("/detokenize", json={"tokens": tokenized["tokens"]})
        assert back.json() == {"prompt": text}
        chat = client.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}],
                                              "return_token_strs": True}).json()
        assert len(chat["token_strs"]) == chat["count"]
        bad = client.post("/detokenize", json={"tokens": [-1]})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
        assert client.get("/version").json()["version"]


async def test_aborted_streams_free_every_kv_block(make_engine: EngineFactory) -> None:
    engine = make_engine(token_delay_s=0.01)
    with live_server(auth_config(), engine) as server:
        fake = server.fake
        started = 0
        all_started = asyncio.Event()
        limits = httpx.Limits(max_connections=300, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=server.url, limits=limits, timeout=30,
                                     headers={"authorization": "Bearer sk-nightly-1"}) as client:
            async def one(i: int) -> None:
                nonlocal started
                body = {"prompt": f"stream {i}", "max_tokens": 200, "stream": True}
                async with client.stream("POST", "/v1/completions", json=body) as response:
                    assert response.status_code == 200
                    async for line in response.aiter_lines():
                        if line.startswith("data: "):
                            break
                    started += 1
                    if started == 200:
                        all_started.set()
                    await all_started.wait()  # leave with the stream still running

            tasks = [asyncio.create_task(one(i)) for i in range(200)]
            await asyncio.wait_for(all_started.wait(), 60)
            assert fake.kv_blocks_in_use > 0
            await asyncio.gather(*tasks)
        await asyncio.to_thread(_wait_until, lambda: fake.num_requests == 0)
        assert fake.kv_blocks_in_use == 0
        assert fake.abort_reasons["abort"] == 200


async def test_non_streaming_disconnect_aborts(make_engine: EngineFactory) -> None:
    engine = make_engine(token_delay_s=0.01)
    with live_server(auth_config(), engine) as server:
        fake = server.fake
        async with httpx.AsyncClient(base_url=server.url, timeout=0.3,
                                     headers={"authorization": "Bearer sk-ide-1"}) as client:
            with pytest.raises(httpx.ReadTimeout):
                await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 200})
        await asyncio.to_thread(_wait_until, lambda: fake.num_requests == 0)
        assert fake.kv_blocks_in_use == 0
        assert fake.abort_reasons["abort"] == 1
