"""`POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter`: admin keys, bad input, vLLM's
answers (the unload under streams in flight: test_lora_live.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.gateway.harness import (
    TENANTS_YAML,
    EngineFactory,
    FakeAdapterHost,
    Harness,
    adapter_folder,
    auth_config,
    running,
    with_adapters,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")

ADMIN = {"authorization": "Bearer sk-admin-1"}
LOAD, UNLOAD = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"
assert "sk-admin-1" in TENANTS_YAML


@pytest.fixture
def host() -> FakeAdapterHost:
    return FakeAdapterHost()


@pytest.fixture
async def gw(make_engine: EngineFactory, host: FakeAdapterHost) -> AsyncIterator[Harness]:
    async with running(auth_config(), with_adapters(make_engine(), host)) as h:
        yield h


async def test_load_then_unload_as_vllm_answers(gw: Harness, host: FakeAdapterHost,
                                                tmp_path: Path) -> None:
    folder = adapter_folder(tmp_path / "sql")
    r = await gw.client.post(LOAD, headers=ADMIN, json={"lora_name": "sql",
                                                       "lora_path": str(folder)})
    assert r.status_code == 200
    assert r.text == "Success: LoRA adapter 'sql' added successfully."
    ids = [m["id"] for m in (await gw.client.get("/v1/models", headers=ADMIN)).json()["data"]]
    assert ids == ["tiny", "sql"] and host.loaded == {"sql": str(folder)}
    r = await gw.client.post("/v1/completions", headers={"authorization": "Bearer sk-ide-1"},
                             json={"model": "sql", "prompt": "hi", "max_tokens": 2})
    assert r.status_code == 200 and r.json()["model"] == "sql"
    r = await gw.client.post(UNLOAD, headers=ADMIN, json={"lora_name": "sql"})
    assert r.status_code == 200
    assert r.text == "Success: LoRA adapter 'sql' removed successfully."
    assert host.removed == ["sql"]
    r = await gw.client.post("/v1/completions", headers={"authorization": "Bearer sk-ide-1"},
                             json={"model": "sql", "prompt": "hi", "max_tokens": 2})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize(("headers", "status"), [
    ({}, 401), ({"authorization": "Bearer sk-ide-1"}, 403), ({"authorization": "Bearer x"}, 401)])
async def test_only_admin_keys_load_and_unload(gw: Harness, host: FakeAdapterHost,
                                               tmp_path: Path, headers: dict[str, str],
                                               status: int) -> None:
    folder = adapter_folder(tmp_path / "sql")
    for path, body in ((LOAD, {"lora_name": "sql", "lora_path": str(folder)}),
                       (UNLOAD, {"lora_name": "sql"})):
        r = await gw.client.post(path, headers=headers, json=body)
        assert r.status_code == status, path
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert host.loaded == {}


@pytest.mark.parametrize(("body", "status", "param", "code"), [
    ({"lora_path": "/x"}, 400, "lora_name", None),
    ({"lora_name": "sql"}, 400, "lora_path", None),
    ({"lora_name": 3, "lora_path": "/x"}, 400, "lora_name", None),
    ({"lora_name": "bad name", "lora_path": "/x"}, 400, "lora_name", None),
    ({"lora_name": "tiny", "lora_path": "FOLDER"}, 400, "lora_name", "invalid_lora_adapter"),
    ({"lora_name": "sql", "lora_path": "/nonexistent"}, 400, "lora_path",
     "invalid_lora_adapter"),
])
async def test_bad_loads_are_400_naming_the_field(gw: Harness, tmp_path: Path,
                                                  body: dict[str, object], status: int,
                                                  param: str, code: str | None) -> None:
    body = {k: str(adapter_folder(tmp_path / "a")) if v == "FOLDER" else v
            for k, v in body.items()}
    r = await gw.client.post(LOAD, headers=ADMIN, json=body)
    assert r.status_code == status
    error = r.json()["error"]
    assert (error["param"], error["code"]) == (param, code), error
    if body.get("lora_path") == "/nonexistent":
        assert "/nonexistent has no adapter_config.json" in error["message"]


async def test_duplicates_unknowns_and_broken_json(gw: Harness, tmp_path: Path) -> None:
    body = {"lora_name": "sql", "lora_path": str(adapter_folder(tmp_path / "sql"))}
    assert (await gw.client.post(LOAD, headers=ADMIN, json=body)).status_code == 200
    r = await gw.client.post(LOAD, headers=ADMIN, json=body)
    assert r.status_code == 400 and r.json()["error"]["code"] == "lora_adapter_exists"
    r = await gw.client.post(UNLOAD, headers=ADMIN, json={"lora_name": "other"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "lora_adapter_not_found"
    r = await gw.client.post(UNLOAD, headers=ADMIN, content=b"{not json")
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = await gw.client.post(UNLOAD, headers=ADMIN, json=["sql"])
    assert r.status_code == 400


async def test_a_load_may_name_its_base_model(gw: Harness, host: FakeAdapterHost,
                                              tmp_path: Path) -> None:
    folder = str(adapter_folder(tmp_path / "sql"))
    r = await gw.client.post(LOAD, headers=ADMIN, json={"lora_name": "sql", "lora_path": folder,
                                                       "base_model_name": "tiny"})
    assert r.status_code == 200 and host.bases == {"sql": "tiny"}
    r = await gw.client.post(LOAD, headers=ADMIN, json={"lora_name": "q", "lora_path": folder,
                                                       "base_model_name": 3})
    assert r.status_code == 400 and r.json()["error"]["param"] == "base_model_name"
    assert "q" not in host.loaded
