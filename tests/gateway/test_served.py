"""A request's `model` picks the base model or a LoRA adapter, within its tenant's models."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.tenants import parse_tenants
from scheduler.api import Request
from tests.gateway.harness import (
    MODEL,
    EngineFactory,
    FakeAdapterHost,
    Harness,
    adapter_folder,
    make_config,
    record_requests,
    running,
    with_adapters,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")

TENANTS = """\
admin_keys: [sk-admin]
tenants:
  - name: all
    api_keys: [sk-all]
  - name: sql-only
    api_keys: [sk-sql]
    models: [sql]
    default_model: sql
  - name: base-only
    api_keys: [sk-base]
    models: [tiny]
"""


def key(k: str) -> dict[str, str]:
    return {"authorization": f"Bearer {k}"}


@pytest.fixture
async def served(make_engine: EngineFactory, tmp_path: Path) -> AsyncIterator[Harness]:
    engine = with_adapters(make_engine(), FakeAdapterHost(),
                           sql=adapter_folder(tmp_path / "sql"),
                           chat=adapter_folder(tmp_path / "chat"))
    async with running(make_config(parse_tenants(TENANTS)), engine) as h:
        yield h


async def complete(h: Harness, api_key: str, **body: object) -> tuple[int, dict]:
    r = await h.client.post("/v1/completions", headers=key(api_key),
                            json={"prompt": "hello", "max_tokens": 3, **body})
    return r.status_code, r.json()


async def test_model_picks_the_base_or_an_adapter(served: Harness) -> None:
    seen: list[Request] = record_requests(served.engine)
    status, body = await complete(served, "sk-all", model="sql")
    assert status == 200 and body["model"] == "sql"
    status, body = await complete(served, "sk-all", model=MODEL)
    assert status == 200 and body["model"] == MODEL
    status, body = await complete(served, "sk-all")  # no model: the base, as vLLM
    assert status == 200 and body["model"] == MODEL
    r = await served.client.post("/v1/chat/completions", headers=key("sk-all"), json={
        "model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert r.status_code == 200 and r.json()["model"] == "chat"
    assert [s.adapter for s in seen] == ["sql", None, None, "chat"]
    assert served.engine.adapters.in_flight("sql") == 0  # every lease released


async def test_unknown_model_is_404_model_not_found(served: Harness) -> None:
    for path, body in (("/v1/completions", {"prompt": "x"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
                       ("/tokenize", {"prompt": "x"})):
        r = await served.client.post(path, headers=key("sk-all"), json={**body, "model": "nope"})
        assert r.status_code == 404, path
        assert r.json()["error"] == {"message": "The model 'nope' does not exist.",
                                     "type": "not_found_error", "param": "model",
                                     "code": "model_not_found"}


async def test_a_tenants_models_list_is_enforced_with_403(served: Harness) -> None:
    status, body = await complete(served, "sk-sql", model=MODEL)
    assert status == 403 and body["error"]["code"] == "model_not_allowed"
    assert body["error"]["param"] == "model"
    status, body = await complete(served, "sk-base", model="chat")
    assert status == 403 and body["error"]["code"] == "model_not_allowed"
    status, body = await complete(served, "sk-sql", model="nope")  # unknown stays 404
    assert status == 404
    r = await served.client.post("/tokenize", headers=key("sk-base"),
                                 json={"model": "sql", "prompt": "x"})
    assert r.status_code == 403


async def test_default_model_serves_requests_without_one(served: Harness) -> None:
    seen = record_requests(served.engine)
    status, body = await complete(served, "sk-sql")
    assert status == 200 and body["model"] == "sql" and seen[0].adapter == "sql"
    status, body = await complete(served, "sk-sql", model="sql")
    assert status == 200


async def test_models_lists_what_the_tenant_may_use(served: Harness, tmp_path: Path) -> None:
    async def ids(api_key: str) -> list[str]:
        r = await served.client.get("/v1/models", headers=key(api_key))
        assert r.status_code == 200
        return [m["id"] for m in r.json()["data"]]

    assert await ids("sk-all") == [MODEL, "sql", "chat"]
    assert await ids("sk-admin") == [MODEL, "sql", "chat"]
    assert await ids("sk-sql") == ["sql"]
    assert await ids("sk-base") == [MODEL]
    data = (await served.client.get("/v1/models", headers=key("sk-all"))).json()["data"]
    assert data[1] == {"id": "sql", "object": "model", "created": data[0]["created"],
                       "owned_by": "slicegate", "root": str(tmp_path / "sql"), "parent": MODEL,
                       "max_model_len": data[0]["max_model_len"]}
    assert data[0]["parent"] is None


async def test_request_metrics_carry_the_adapters_model_name(served: Harness) -> None:
    await complete(served, "sk-all", model="sql")
    await complete(served, "sk-all", model=MODEL)
    text = (await served.client.get("/metrics")).text
    assert 'vllm:request_success_total{finished_reason="length",model_name="sql"' in text
    assert f'vllm:request_success_total{{finished_reason="length",model_name="{MODEL}"' in text
