"""Tenants cannot time each other: the prefix cache is per tenant unless both share, and
vLLM's `cache_salt` splits it further (CVE-2025-46570: a shared cache's TTFT leaks prompts).

The salts a request is keyed with are read off a fake scheduler; that equal salts hit and
unequal ones miss is shown on a real server (`usage.prompt_tokens_details.cached_tokens`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from gateway.admission import prefix_cache_salt
from gateway.protocol import MAX_CACHE_SALT_CHARS
from gateway.tenants import Tenant, parse_tenants
from tests.gateway.batches.helpers import COMPLETIONS, line, submit, wait_for
from tests.gateway.harness import (
    TENANTS_YAML,
    EngineFactory,
    Harness,
    make_config,
    record_requests,
    running,
)
from tests.serve import GatewayProcess

pytestmark = pytest.mark.asyncio(loop_scope="session")

SHARED_YAML = TENANTS_YAML + """\
  - name: team-a
    api_keys: [sk-a-1]
    share_prefix_cache: true
  - name: team-b
    api_keys: [sk-b-1]
    share_prefix_cache: true
"""


def _body(chat: bool, **extra: Any) -> dict[str, Any]:
    prompt = {"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "hi"}
    return {"model": "tiny", "max_tokens": 2, **prompt, **extra}


async def _post(h: Harness, key: str, chat: bool, **extra: Any) -> int:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    r = await h.client.post(path, json=_body(chat, **extra),
                            headers={"Authorization": f"Bearer {key}"})
    return r.status_code


async def test_a_request_salt_cannot_pose_as_another_tenant() -> None:
    ide, shared = Tenant("ide"), Tenant("a", share_prefix_cache=True)
    assert (ide.cache_salt, shared.cache_salt) == ("tenant:ide", "")
    salts = {prefix_cache_salt(ide, None), prefix_cache_salt(shared, None),
             prefix_cache_salt(ide, "x"), prefix_cache_salt(shared, "x"),
             prefix_cache_salt(shared, "tenant:ide"), prefix_cache_salt(Tenant("id"), "ex"),
             prefix_cache_salt(shared, "10:tenant:idex")}
    assert len(salts) == 7  # no two of them meet in the cache


@pytest.mark.parametrize("chat", [False, True])
async def test_salts_reach_the_scheduler(make_engine: EngineFactory, chat: bool) -> None:
    async with running(make_config(parse_tenants(SHARED_YAML)), make_engine()) as h:
        salts = record_requests(h.engine)
        for key, extra in (("sk-ide-1", {}), ("sk-chat-1", {}), ("sk-a-1", {}), ("sk-b-1", {}),
                           ("sk-ide-1", {"cache_salt": "s1"}), ("sk-a-1", {"cache_salt": "s1"}),
                           ("sk-b-1", {"cache_salt": "s1"})):
            assert await _post(h, key, chat, **extra) == 200
    assert [r.cache_salt for r in salts] == ["tenant:ide", "tenant:chat", "", "", "10:tenant:ides1",
                                             "0:s1", "0:s1"]


async def test_auth_off_keys_every_request_alike(make_engine: EngineFactory) -> None:
    async with running(make_config(), make_engine()) as h:
        salts = record_requests(h.engine)
        for chat in (False, True, False):
            assert await _post(h, "none", chat) == 200
        assert await _post(h, "none", False, cache_salt="s") == 200
    keys = [r.cache_salt for r in salts]
    assert len(set(keys[:3])) == 1 and keys[3] != keys[0]


async def test_a_batch_line_keeps_its_cache_salt(make_engine: EngineFactory) -> None:
    async with running(make_config(parse_tenants(SHARED_YAML)), make_engine()) as h:
        salts = record_requests(h.engine)
        lines = [line(0, COMPLETIONS, cache_salt="s1"), line(1, COMPLETIONS)]
        batch = await submit(h.client, "sk-nightly-1", lines, COMPLETIONS)
        done = await wait_for(h.client, "sk-nightly-1", batch["id"])
    assert done["request_counts"]["completed"] == 2
    assert sorted(r.cache_salt for r in salts) == ["14:tenant:nightlys1", "tenant:nightly"]


@pytest.mark.parametrize(("value", "problem"), [
    (7, "expected a string"), ("", "non-empty string"),
    ("x" * (MAX_CACHE_SALT_CHARS + 1), f"at most {MAX_CACHE_SALT_CHARS} characters")])
async def test_a_bad_cache_salt_is_a_400_naming_it(gateway: Harness, value: Any,
                                                   problem: str) -> None:
    for path in ("/v1/completions", "/v1/chat/completions"):
        r = await gateway.client.post(path, json=_body(path.endswith("chat/completions"),
                                                       cache_salt=value))
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "cache_salt" and problem in error["message"]
        assert error["type"] == "invalid_request_error"
    ok = await gateway.client.post("/v1/completions",
                                   json=_body(False, cache_salt="x" * MAX_CACHE_SALT_CHARS))
    assert ok.status_code == 200, ok.text


# ---- a real server: cached_tokens as the openai client reads them ----------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    tmp: Path = tmp_path_factory.mktemp("isolation")
    (tmp / "tenants.yaml").write_text(SHARED_YAML)
    args = ["--model", "tiny-random", "--dtype", "float32", "--device-memory-gib", "0.25",
            "--tenants", str(tmp / "tenants.yaml"), "--log-level", "warning",
            "--data-dir", str(tmp / "data")]
    with GatewayProcess(args, tmp / "server.log") as s:
        yield s


async def _cached(server: GatewayProcess, key: str, prompt: str, chat: bool = False,
                  **extra: Any) -> int:
    async with openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=key,
                                  max_retries=0) as client:
        if chat:
            usage = (await client.chat.completions.create(
                model="tiny-random", messages=[{"role": "user", "content": prompt}],
                max_tokens=2, extra_body=extra)).usage
        else:
            usage = (await client.completions.create(
                model="tiny-random", prompt=prompt, max_tokens=2, extra_body=extra)).usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens is not None
    return usage.prompt_tokens_details.cached_tokens


@pytest.mark.parametrize("chat", [False, True])
async def test_tenants_hit_each_others_blocks_only_when_both_share(server: GatewayProcess,
                                                                   chat: bool) -> None:
    prompt = f"the same long system prompt ({'chat' if chat else 'text'}), " * 10
    assert await _cached(server, "sk-ide-1", prompt, chat) == 0
    hit = await _cached(server, "sk-ide-1", prompt, chat)
    assert hit >= 64  # the tenant's own blocks
    assert await _cached(server, "sk-chat-1", prompt, chat) == 0  # isolated by default
    assert await _cached(server, "sk-a-1", prompt, chat) == 0  # the shared pool: its own
    assert await _cached(server, "sk-b-1", prompt, chat) == hit  # both share: b hits a's blocks


async def test_cache_salt_separates_requests_of_one_tenant(server: GatewayProcess) -> None:
    prompt = "a salted prompt that fills several blocks of sixteen tokens, " * 8
    assert await _cached(server, "sk-ide-1", prompt, cache_salt="alice") == 0
    hit = await _cached(server, "sk-ide-1", prompt, cache_salt="alice")
    assert hit >= 64
    assert await _cached(server, "sk-ide-1", prompt, cache_salt="bob") == 0
    assert await _cached(server, "sk-ide-1", prompt) == 0  # no salt: not alice's blocks either
    assert await _cached(server, "sk-chat-1", prompt, cache_salt="alice") == 0  # another tenant
    assert await _cached(server, "sk-a-1", prompt, cache_salt="alice") == 0  # not ide's alice
    assert await _cached(server, "sk-b-1", prompt, cache_salt="alice") == hit  # a's: both share
