"""`/admin/tenants` over the app: changes take effect on the next request, keys are never
echoed unless made by the server, bad input gets a clear 400, budgets answer 429
insufficient_quota and outlive a restart."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.config import GatewayConfig
from gateway.tenancy.keys import hash_key, key_id
from gateway.tenants import load_tenants
from tests.gateway.harness import EngineFactory, make_config, running

pytestmark = pytest.mark.asyncio(loop_scope="session")

FILE = """\
admin_keys: [sk-admin]
tenants:
  - {name: ide, api_keys: [sk-ide], priority: high}
  - name: metered
    api_key_sha256: [SHA]
    budget: {daily_tokens: 100}
""".replace("SHA", hash_key("sk-metered"))
ADMIN = {"authorization": "Bearer sk-admin"}


def config_for(tmp_path: Path, text: str = FILE) -> GatewayConfig:
    path = tmp_path / "tenants.yaml"
    path.write_text(text)
    return dataclasses.replace(make_config(load_tenants(path)), tenants_file=str(path))


async def complete(client: httpx.AsyncClient, key: str, **body: Any) -> httpx.Response:
    return await client.post("/v1/completions", headers={"authorization": f"Bearer {key}"},
                             json={"prompt": "hello there", "max_tokens": 5, **body})


async def test_add_change_revoke_delete(make_engine: EngineFactory, tmp_path: Path) -> None:
    async with running(config_for(tmp_path), make_engine()) as h:
        c = h.client
        made = await c.post("/admin/tenants", headers=ADMIN,
                            json={"name": "team-a", "priority": "low"})
        assert made.status_code == 201, made.text
        key = made.json()["api_key"]
        assert made.json()["keys"][0]["id"] == key_id(hash_key(key))
        assert (await complete(c, key)).headers["x-slicegate-priority"] == "low"
        listed = (await c.get("/admin/tenants", headers=ADMIN)).text
        assert key not in listed and hash_key(key) not in listed
        assert "sk-ide" not in listed and '"source":"admin"' in listed

        patched = await c.patch("/admin/tenants/team-a", headers=ADMIN,
                                json={"priority": "normal", "ttft_slo_ms": 900,
                                      "tpot_slo_ms": 60})
        assert patched.json()["priority"] == "normal" and patched.json()["ttft_slo_ms"] == 900
        assert patched.json()["tpot_slo_ms"] == 60
        bad = await c.patch("/admin/tenants/team-a", headers=ADMIN, json={"tpot_slo_ms": -1})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "tpot_slo_ms", bad.text
        assert (await complete(c, key)).headers["x-slicegate-priority"] == "normal"

        own = await c.post("/admin/tenants/team-a/keys", headers=ADMIN,
                           json={"api_key": "sk-team-a-2"})
        assert own.status_code == 201 and "api_key" not in own.json()
        revoked = await c.delete(f"/admin/tenants/team-a/keys/{key_id(hash_key(key))}",
                                 headers=ADMIN)
        assert revoked.json()["deleted"] is True
        assert (await complete(c, key)).status_code == 401
        assert (await complete(c, "sk-team-a-2")).status_code == 200

        assert (await c.delete("/admin/tenants/team-a", headers=ADMIN)).status_code == 200
        assert (await complete(c, "sk-team-a-2")).status_code == 401
        assert (await c.get("/admin/tenants/team-a", headers=ADMIN)).status_code == 404

        audit = (await c.get("/admin/audit", headers=ADMIN)).json()
        actions = [e["action"] for e in audit["data"]]
        assert actions == ["tenant.delete", "key.revoke", "key.create", "tenant.update",
                           "tenant.create"]
        assert {e["actor"] for e in audit["data"]} == {"admin:" + key_id(hash_key("sk-admin"))}


@pytest.mark.parametrize(("method", "path", "body", "status", "param"), [
    ("post", "/admin/tenants", {"name": "x", "priority": "urgent"}, 400, "priority"),
    ("post", "/admin/tenants", {"name": "x", "budget": {"daily_tokens": -1}},
     400, "budget.daily_tokens"),
    ("post", "/admin/tenants", {"name": "a/b"}, 400, "name"),
    ("post", "/admin/tenants", {"name": "x", "colour": 1}, 400, "colour"),
    ("post", "/admin/tenants", {"name": "ide"}, 409, "name"),
    ("post", "/admin/tenants", {"name": "x", "api_keys": ["sk-ide"]}, 409, "api_key"),
    ("post", "/admin/tenants", [1], 400, None),
    ("patch", "/admin/tenants/ide", {"api_keys": ["k"]}, 400, "api_keys"),
    ("patch", "/admin/tenants/ide", {"name": "other"}, 400, "name"),
    ("patch", "/admin/tenants/nobody", {}, 404, "name"),
    ("post", "/admin/tenants/ide/keys", {"api_key_sha256": "abc"}, 400, "api_key_sha256"),
    ("post", "/admin/tenants/ide/keys", {"api_key": "a", "api_key_sha256": "b"}, 400, None),
    ("delete", "/admin/tenants/ide/keys/key-nope", None, 404, "key_id"),
    ("get", "/admin/audit?limit=0", None, 400, "limit"),
    ("get", "/admin/audit?before=x", None, 400, "before"),
])
async def test_bad_input_gets_a_clear_error(make_engine: EngineFactory, tmp_path: Path,
                                            method: str, path: str, body: Any, status: int,
                                            param: str | None) -> None:
    async with running(config_for(tmp_path), make_engine()) as h:
        kwargs: dict[str, Any] = {} if body is None else {"json": body}
        r = await h.client.request(method.upper(), path, headers=ADMIN, **kwargs)
        assert r.status_code == status, r.text
        error = r.json()["error"]
        assert error["param"] == param and error["message"], error


async def test_only_admins_change_tenants(make_engine: EngineFactory, tmp_path: Path) -> None:
    async with running(config_for(tmp_path), make_engine()) as h:
        tenant = await h.client.post("/admin/tenants", json={"name": "x"},
                                     headers={"authorization": "Bearer sk-ide"})
        nobody = await h.client.get("/admin/tenants")
        assert (tenant.status_code, nobody.status_code) == (403, 401)
    async with running(make_config(), make_engine()) as h:  # auth off: reads only
        assert (await h.client.get("/admin/tenants")).json()["data"] == []
        refused = await h.client.post("/admin/tenants", json={"name": "x"})
        assert refused.status_code == 403 and "admin_keys" in refused.json()["error"]["message"]
        assert (await h.client.post("/admin/tenants/reload")).status_code == 403


async def test_reload_reads_the_file(make_engine: EngineFactory, tmp_path: Path) -> None:
    async with running(config_for(tmp_path), make_engine()) as h:
        (tmp_path / "tenants.yaml").write_text(FILE + "  - {name: late, api_keys: [sk-late]}\n")
        r = await h.client.post("/admin/tenants/reload", headers=ADMIN)
        assert r.json()["added"] == ["late"] and r.json()["tenants"] == 3
        assert (await complete(h.client, "sk-late")).status_code == 200
        (tmp_path / "tenants.yaml").write_text("tenants: [{name: late}]\n")
        bad = await h.client.post("/admin/tenants/reload", headers=ADMIN)
        assert bad.status_code == 400 and "tenants[0].api_keys" in bad.json()["error"]["message"]
        assert (await complete(h.client, "sk-late")).status_code == 200  # unchanged


async def test_budget_is_enforced_and_survives_a_restart(make_engine: EngineFactory,
                                                         tmp_path: Path) -> None:
    config = config_for(tmp_path)
    served = 0
    async with running(config, make_engine()) as h:
        while True:
            r = await complete(h.client, "sk-metered", max_tokens=16)
            if r.status_code != 200:
                break
            served += r.json()["usage"]["total_tokens"]
        assert r.status_code == 429, r.text
        assert served > 90  # the last ones clipped, until not even a prompt fits
        assert r.json()["error"]["type"] == r.json()["error"]["code"] == "insufficient_quota"
        usage = (await h.client.get("/admin/tenants/metered/usage", headers=ADMIN)).json()
        assert usage["daily"]["spent_tokens"] == served <= 100
        assert usage["daily"]["limit_tokens"] == 100 and usage["monthly"]["limit_tokens"] is None
        metrics = (await h.client.get("/metrics")).text
        assert (f'slicegate_tenant_budget_spent_tokens{{tenant="metered",window="daily"}} '
                f'{served}.0') in metrics
        assert 'slicegate_tenant_budget_limit_tokens{tenant="metered",window="daily"} 100.0' \
            in metrics
    async with running(config, make_engine()) as h:  # a new app on the same data dir
        again = await complete(h.client, "sk-metered", max_tokens=16)
        assert again.status_code == 429
        usage = (await h.client.get("/admin/tenants/metered/usage", headers=ADMIN)).json()
        assert usage["daily"]["spent_tokens"] == served
        raised = await h.client.patch("/admin/tenants/metered", headers=ADMIN,
                                      json={"budget": {"daily_tokens": served + 30}})
        assert raised.status_code == 200
        r = await complete(h.client, "sk-metered", max_tokens=100)
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"
        assert r.json()["usage"]["total_tokens"] <= 30  # clipped to what remained


async def test_a_tenants_models_change_without_restart(make_engine: EngineFactory,
                                                      tmp_path: Path) -> None:
    async with running(config_for(tmp_path), make_engine()) as h:
        c = h.client
        assert (await complete(c, "sk-ide")).status_code == 200
        r = await c.patch("/admin/tenants/ide", headers=ADMIN, json={"models": ["other"]})
        assert r.status_code == 200 and r.json()["models"] == ["other"]
        refused = await complete(c, "sk-ide")
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "model_not_allowed"
        r = await c.patch("/admin/tenants/ide", headers=ADMIN,
                          json={"models": ["tiny"], "default_model": "nope"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "default_model"
        r = await c.patch("/admin/tenants/ide", headers=ADMIN, json={"models": None})
        assert r.status_code == 200 and r.json()["models"] is None
        assert (await complete(c, "sk-ide")).status_code == 200
