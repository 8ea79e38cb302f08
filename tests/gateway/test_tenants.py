"""Tenants file parsing (errors name line and field), auth, and priority lowering."""

from __future__ import annotations

import itertools

import pytest

from executors.types import Priority
from gateway.errors import ApiError
from gateway.tenants import (
    TenantsFileError,
    authenticate,
    authorize_admin,
    effective_priority,
    load_tenants,
    parse_tenants,
    tenant_spec,
)
from tests.gateway.harness import TENANTS_YAML, EngineFactory, auth_config, running

pytestmark = pytest.mark.asyncio(loop_scope="session")

ISSUE_EXAMPLE = """\
admin_keys: [sk-admin-1]
tenants:
  - name: ide
    api_keys: [sk-ide-1]
    priority: high
    ttft_slo_ms: 500
    max_concurrency: 64
    requests_per_minute: 600
    tokens_per_minute: 200000
  - name: nightly
    api_keys: [sk-nightly-1]
    priority: low
"""


async def test_parse_issue_example() -> None:
    config = parse_tenants(ISSUE_EXAMPLE)
    ide, nightly = config.tenants
    assert (ide.name, ide.priority, ide.ttft_slo_s, ide.max_concurrency) == (
        "ide", Priority.HIGH, 0.5, 64)
    assert (ide.requests_per_minute, ide.tokens_per_minute) == (600, 200000)
    assert nightly.priority is Priority.LOW and nightly.max_concurrency is None
    assert config.tenant_for("sk-nightly-1") is nightly and config.is_admin("sk-admin-1")
    assert config.auth_enabled
    assert not ide.share_prefix_cache and ide.cache_salt == "tenant:ide"  # isolated by default


async def test_share_prefix_cache_true_puts_the_tenant_in_the_shared_pool() -> None:
    text = ISSUE_EXAMPLE.replace("priority: low", "priority: low\n    share_prefix_cache: true")
    nightly = parse_tenants(text).tenants[1]
    assert nightly.share_prefix_cache and nightly.cache_salt == ""
    with pytest.raises(TenantsFileError, match="share_prefix_cache: must be true or false"):
        parse_tenants(text.replace("share_prefix_cache: true", "share_prefix_cache: nope"))


@pytest.mark.parametrize(("text", "where"), [
    (ISSUE_EXAMPLE.replace("priority: low", "priority: urgent"), ":12: tenants[1].priority"),
    (ISSUE_EXAMPLE.replace("ttft_slo_ms: 500", "ttft_slo_ms: -5"), ":6: tenants[0].ttft_slo_ms"),
    (ISSUE_EXAMPLE.replace("max_concurrency: 64", "max_concurrency: 1.5"),
     ":7: tenants[0].max_concurrency"),
    (ISSUE_EXAMPLE.replace("tokens_per_minute: 200000", "tokens_per_min: 5"),
     ":9: tenants[0].tokens_per_min"),
    (ISSUE_EXAMPLE.replace("    api_keys: [sk-nightly-1]\n", ""), ":10: tenants[1].api_keys"),
    (ISSUE_EXAMPLE.replace("sk-nightly-1", "sk-ide-1"), ":11: tenants[1].api_keys"),
    (ISSUE_EXAMPLE.replace("name: nightly", "name: ide"), ":10: tenants[1].name"),
    (ISSUE_EXAMPLE.replace("  - name: nightly", "  - name: [x"), ":11: invalid YAML"),
    ("tenants: 5\n", ":1: tenants"),
    ("admin_keys: [sk-a]\nusers: []\n", ":2: users"),
    ("- a\n", ":1: expected a mapping"),
])
async def test_errors_name_line_and_field(text: str, where: str) -> None:
    with pytest.raises(TenantsFileError) as info:
        parse_tenants(text, "tenants.yaml")
    assert str(info.value).startswith("tenants.yaml" + where), str(info.value)


async def test_load_missing_file(tmp_path: object) -> None:
    with pytest.raises(TenantsFileError, match="cannot read"):
        load_tenants("/nonexistent/tenants.yaml")


async def test_authentication() -> None:
    config = parse_tenants(TENANTS_YAML)
    assert authenticate(config, "Bearer sk-chat-1").name == "chat"
    assert authenticate(config, "bearer  sk-chat-1 ").name == "chat"
    for header in (None, "", "Bearer", "Basic sk-chat-1", "Bearer sk-admin-1"):
        with pytest.raises(ApiError) as info:
            authenticate(config, header)
        assert info.value.status == 401
    authorize_admin(config, "Bearer sk-admin-1")
    with pytest.raises(ApiError) as info:
        authorize_admin(config, "Bearer sk-ide-1")
    assert info.value.status == 403
    off = parse_tenants("{}")
    assert not off.auth_enabled and authenticate(off, None).priority is Priority.HIGH


HEADERS = (None, "high", "normal", "low")
BODY = (None, -5, 0, 1, 2, 9)
TIERS = (None, "auto", "default", "priority", "flex")


@pytest.mark.parametrize("tenant", list(Priority))
async def test_no_field_can_raise_priority(tenant: Priority) -> None:
    for header, body, tier in itertools.product(HEADERS, BODY, TIERS):
        result = effective_priority(tenant, header, body, tier)
        assert result >= tenant, (tenant, header, body, tier)  # larger value = lower class


async def test_each_field_lowers() -> None:
    high = Priority.HIGH
    assert effective_priority(high) is high
    assert effective_priority(high, header="low") is Priority.LOW
    assert effective_priority(high, header=" Normal ") is Priority.NORMAL
    assert effective_priority(high, body_priority=1) is Priority.NORMAL
    assert effective_priority(high, body_priority=2) is Priority.LOW
    assert effective_priority(high, body_priority=0) is high
    assert effective_priority(high, service_tier="flex") is Priority.LOW
    assert effective_priority(Priority.NORMAL, service_tier="default") is Priority.NORMAL
    assert effective_priority(high, header="normal", service_tier="flex") is Priority.LOW


async def test_priority_over_http(make_engine: EngineFactory) -> None:
    async with running(auth_config(), make_engine()) as h:
        async def klass(key: str, headers: dict[str, str] | None = None, **body: object) -> str:
            response = await h.client.post(
                "/v1/completions", json={"prompt": "x", "max_tokens": 1, **body},
                headers={"authorization": f"Bearer {key}", **(headers or {})})
            assert response.status_code == 200, response.text
            return response.headers["x-slicegate-priority"]

        assert await klass("sk-nightly-1") == "low"
        assert await klass("sk-nightly-1", {"x-priority": "high"}) == "low"
        assert await klass("sk-nightly-1", priority=-10) == "low"
        assert await klass("sk-nightly-1", service_tier="priority") == "low"
        assert await klass("sk-chat-1", {"x-priority": "high"}, priority=0,
                           service_tier="priority") == "normal"
        assert await klass("sk-ide-1") == "high"
        assert await klass("sk-ide-1", {"x-priority": "low"}) == "low"
        assert await klass("sk-ide-1", priority=1) == "normal"
        assert await klass("sk-ide-1", service_tier="flex") == "low"
        bad = await h.client.post("/v1/completions", json={"prompt": "x"},
                                  headers={"authorization": "Bearer sk-ide-1",
                                           "x-priority": "urgent"})
        assert bad.status_code == 400 and "X-Priority" in bad.json()["error"]["message"]


async def test_models_and_default_model_are_read_and_checked() -> None:
    text = ("tenants:\n  - name: a\n    api_keys: [k1]\n    models: [tiny, sql]\n"
            "    default_model: sql\n  - name: b\n    api_keys: [k2]\n")
    a, b = parse_tenants(text).tenants
    assert a.models == ("tiny", "sql") and a.default_model == "sql"
    assert a.may_use("sql") and not a.may_use("chat") and a.may_use("alias", "tiny")
    assert b.models is None and b.default_model is None and b.may_use("anything")
    assert tenant_spec(a)["models"] == ["tiny", "sql"] and tenant_spec(a)["default_model"] == "sql"
    for bad, where in (("models: [tiny, sql]", "models: tiny"),
                       ("models: [tiny, sql]", "models: [tiny, 3]"),
                       ("default_model: sql", "default_model: chat")):
        with pytest.raises(TenantsFileError) as info:
            parse_tenants(text.replace(bad, where), "t.yaml")
        assert str(info.value).startswith("t.yaml:"), str(info.value)
        assert ("tenants[0].models" in str(info.value)
                or "tenants[0].default_model" in str(info.value))


async def test_tpot_slo_ms_is_read_checked_and_written() -> None:
    text = ISSUE_EXAMPLE.replace("ttft_slo_ms: 500", "ttft_slo_ms: 500\n    tpot_slo_ms: 48")
    ide, nightly = parse_tenants(text).tenants
    assert (ide.tpot_slo_ms, ide.tpot_slo_s, nightly.tpot_slo_s) == (48, 0.048, None)
    assert tenant_spec(ide)["tpot_slo_ms"] == 48 and tenant_spec(nightly)["tpot_slo_ms"] is None
    for bad in ("0", "-1", "fast"):
        with pytest.raises(TenantsFileError) as info:
            parse_tenants(text.replace("tpot_slo_ms: 48", f"tpot_slo_ms: {bad}"), "t.yaml")
        assert str(info.value).startswith("t.yaml:7: tenants[0].tpot_slo_ms"), str(info.value)
