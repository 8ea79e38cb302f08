"""/v1/models, /health and the admin endpoints (admin keys only)."""

from __future__ import annotations

import pytest

from tests.gateway.harness import EngineFactory, Harness, auth_config, running

pytestmark = pytest.mark.asyncio(loop_scope="session")

ADMIN = {"authorization": "Bearer sk-admin-1"}
TENANT = {"authorization": "Bearer sk-ide-1"}


async def test_models(gateway: Harness) -> None:
    body = (await gateway.client.get("/v1/models")).json()
    assert body["object"] == "list"
    [model] = body["data"]
    assert model["id"] == "tiny" and model["object"] == "model" and model["max_model_len"] == 256


async def test_health(gateway: Harness) -> None:
    assert (await gateway.client.get("/health")).status_code == 200
    gateway.fake.healthy = False
    response = await gateway.client.get("/health")
    assert response.status_code == 503 and response.json()["status"] == "unhealthy"


async def test_admin_needs_an_admin_key(make_engine: EngineFactory) -> None:
    async with running(auth_config(), make_engine()) as h:
        for path in ("/admin/gmg", "/admin/timeline"):
            assert (await h.client.get(path)).status_code == 401
            bad = await h.client.get(path, headers={"authorization": "Bearer nope"})
            assert bad.status_code == 401 and bad.json()["error"]["type"] == "authentication_error"
            forbidden = await h.client.get(path, headers=TENANT)
            assert forbidden.status_code == 403
            assert forbidden.json()["error"]["type"] == "permission_error"
            assert (await h.client.get(path, headers=ADMIN)).status_code == 200
        direct = {"prompt": "x", "max_tokens": 1}
        assert (await h.client.post("/admin/direct", json=direct)).status_code == 401
        assert (await h.client.post("/admin/direct", json=direct,
                                    headers=TENANT)).status_code == 403
        assert (await h.client.post("/admin/direct", json=direct,
                                    headers=ADMIN)).status_code == 200
        assert (await h.client.get("/v1/models", headers=ADMIN)).status_code == 200
        assert (await h.client.post("/v1/completions", json={"prompt": "x"},
                                    headers=ADMIN)).status_code == 401


async def test_gmg_and_timeline(gateway: Harness) -> None:
    before = (await gateway.client.get("/admin/timeline")).json()["now"]
    await gateway.client.post("/v1/completions", json={"prompt": "x", "max_tokens": 3})
    gmg = (await gateway.client.get("/admin/gmg")).json()
    assert gmg["devices"][0]["name"] == "cpu:0" and "requests" in gmg
    timeline = (await gateway.client.get(f"/admin/timeline?since={before}")).json()
    events = timeline["events"]
    assert len(events) == 3 and {"device", "op", "class", "start", "end"} <= set(events[0])
    assert all(e["tenants"] == ["default"] for e in events)  # request ids -> their tenant
    [finished] = timeline["requests"]
    assert (finished["tenant"], finished["priority"], finished["slo_s"]) == (
        "default", "high", None)
    assert 0 <= finished["ttft_s"] <= finished["end"] - before
    later = (await gateway.client.get(f"/admin/timeline?since={timeline['now']}")).json()
    assert later["events"] == [] and later["requests"] == []
    bad = await gateway.client.get("/admin/timeline?since=yesterday")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "since"


async def test_direct_times_a_completion_body_on_a_device(gateway: Harness) -> None:
    ok = await gateway.client.post("/admin/direct", json={"prompt": "hello there",
                                                          "max_tokens": 3})
    body = ok.json()
    assert ok.status_code == 200 and (body["device"], body["max_tokens"]) == ("cpu:0", 3)
    assert body["prompt_tokens"] > 0 and 0 <= body["first_token_s"] <= body["total_s"]
    default = (await gateway.client.post("/admin/direct", json={"prompt": "x"})).json()
    assert default["max_tokens"] == 16  # as /v1/completions
    errors = [await gateway.client.post("/admin/direct?device=cuda:7", json={"prompt": "x"}),
              await gateway.client.post("/admin/direct", json={"prompt": ["a", "b"]}),
              await gateway.client.post("/admin/direct", json={"prompt": "x",
                                                               "max_tokens": 10_000}),
              await gateway.client.post("/admin/direct", json={"prompt": "x", "model": "m"})]
    assert [e.status_code for e in errors] == [400, 400, 400, 404]
    assert errors[0].json()["error"]["param"] == "device"
    assert errors[2].json()["error"]["code"] == "context_length_exceeded"
