"""The issue's goals on a real server (uvicorn on loopback, the official openai client):
a key added through the admin API works within 1 s while 50 streams run to the end, a
revoked key is refused at once, SIGHUP reloads the file, a budget stops the tokens served."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import httpx
import openai
import pytest

from gateway.tenancy.keys import hash_key, key_id
from tests.gateway.harness import EngineFactory, live_server
from tests.gateway.tenancy.test_admin import ADMIN, FILE, config_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

STREAMS = 50
STREAM_TOKENS = 40


async def _stream(client: openai.AsyncOpenAI, started: list[int]) -> tuple[str | None, int]:
    stream = await client.completions.create(model="tiny", prompt="Hello", stream=True,
                                             max_tokens=STREAM_TOKENS,
                                             stream_options={"include_usage": True})
    finish, tokens = None, 0
    async for chunk in stream:
        if not started or started[-1] is not id(stream):
            started.append(id(stream))
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return finish, tokens


async def test_a_new_key_works_within_a_second_while_50_streams_finish(
        make_engine: EngineFactory, tmp_path: Path) -> None:
    with live_server(config_for(tmp_path), make_engine(token_delay_s=0.05)) as live:
        old = openai.AsyncOpenAI(base_url=f"{live.url}/v1", api_key="sk-ide", max_retries=0)
        seen: list[list[int]] = [[] for _ in range(STREAMS)]
        tasks = [asyncio.create_task(_stream(old, seen[i])) for i in range(STREAMS)]
        while not all(seen):
            await asyncio.sleep(0.01)
        async with httpx.AsyncClient(base_url=live.url, headers=ADMIN) as admin:
            t0 = time.perf_counter()
            made = await admin.post("/admin/tenants/ide/keys", json={})
            new = openai.AsyncOpenAI(base_url=f"{live.url}/v1", api_key=made.json()["api_key"],
                                     max_retries=0)
            answer = await new.completions.create(model="tiny", prompt="x", max_tokens=1)
            took_s = time.perf_counter() - t0
            revoked = await admin.delete(f"/admin/tenants/ide/keys/{key_id(hash_key('sk-ide'))}")
            assert revoked.status_code == 200
            with pytest.raises(openai.AuthenticationError):
                await old.completions.create(model="tiny", prompt="x", max_tokens=1)
            in_flight = sum(not t.done() for t in tasks)
        results = await asyncio.gather(*tasks)
        await old.close()
        await new.close()
    print(f"new key answered {took_s * 1000:.0f} ms after it was added, "
          f"with {in_flight} streams in flight")
    assert answer.choices[0].finish_reason == "length" and took_s < 1.0
    assert in_flight == STREAMS  # the revocation came while every stream was running
    assert results == [("length", STREAM_TOKENS)] * STREAMS


async def test_sighup_reloads_the_tenants_file(make_engine: EngineFactory,
                                               tmp_path: Path) -> None:
    with live_server(config_for(tmp_path), make_engine()) as live:
        (tmp_path / "tenants.yaml").write_text(FILE + "  - {name: late, api_keys: [sk-late]}\n")
        client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="sk-late", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            client.completions.create(model="tiny", prompt="x", max_tokens=1)
        with live.server.capture_signals():  # NOTE: the server's handlers, in the main thread
            os.kill(os.getpid(), signal.SIGHUP)
            deadline = time.monotonic() + 5
            while live.server.on_hangup is not None and time.monotonic() < deadline:
                audit = httpx.get(f"{live.url}/admin/audit", headers=ADMIN).json()["data"]
                if audit:
                    break
                time.sleep(0.02)
        assert audit[0]["actor"] == "signal:SIGHUP" and audit[0]["detail"]["added"] == ["late"]
        assert client.completions.create(model="tiny", prompt="x", max_tokens=1).choices


async def test_no_token_beyond_the_budget_across_a_restart(make_engine: EngineFactory,
                                                           tmp_path: Path) -> None:
    config = config_for(tmp_path)
    served = [0, 0]
    for run in range(2):  # the second server reads the spend the first one wrote
        with live_server(config, make_engine()) as live:
            client = openai.AsyncOpenAI(base_url=f"{live.url}/v1", api_key="sk-metered",
                                        max_retries=0)
            results = await asyncio.gather(*[
                client.chat.completions.create(model="tiny", max_tokens=12,
                                               messages=[{"role": "user", "content": "hi"}])
                for _ in range(12)], return_exceptions=True)
            for r in results:
                if isinstance(r, BaseException):
                    assert isinstance(r, openai.RateLimitError), r
                    assert r.code == "insufficient_quota" and r.status_code == 429
                else:
                    assert r.usage is not None
                    served[run] += r.usage.total_tokens
            with pytest.raises(openai.RateLimitError):
                await client.chat.completions.create(
                    model="tiny", max_tokens=1, messages=[{"role": "user", "content": "hi"}])
            await client.close()
    assert 0 < served[0] <= 100 and served[1] == 0  # usage counted, as the client sees it
