"""Speculative decoding settings through the gateway (fake scheduler): server, tenant and
request, which wins, and 400s for bad values; the config file and the flag."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from gateway.__main__ import build_parser, config_from_args
from gateway.config import ConfigError, load_config
from gateway.tenants import TenantsFileError, parse_tenants, tenant_from_dict, tenant_spec
from models.spec_config import SpecConfig
from tests.gateway.harness import (
    TENANTS_YAML,
    EngineFactory,
    Harness,
    make_config,
    record_requests,
    running,
)

SERVER = SpecConfig(4, 4, 2)
TENANT = SpecConfig(2, 3, 1)
YAML = TENANTS_YAML + """\
  - name: coder
    api_keys: [sk-coder-1]
    speculative_config: {num_speculative_tokens: 2, prompt_lookup_max: 3, prompt_lookup_min: 1}
  - name: plain
    api_keys: [sk-plain-1]
    speculative_config: false
"""


async def _post(h: Harness, key: str, **extra: Any) -> tuple[int, dict[str, Any]]:
    r = await h.client.post("/v1/completions", headers={"Authorization": f"Bearer {key}"},
                            json={"prompt": "hi", "max_tokens": 2, **extra})
    return r.status_code, r.json()


@pytest.mark.asyncio(loop_scope="session")
@pytest.mark.parametrize("server", [SERVER, None])
async def test_the_request_then_the_tenant_then_the_server_decides(
        make_engine: EngineFactory, server: SpecConfig | None) -> None:
    engine = dataclasses.replace(make_engine(), speculative=server)
    own = {"num_speculative_tokens": 3, "prompt_lookup_max": 2}
    async with running(make_config(parse_tenants(YAML)), engine) as h:
        seen = record_requests(h.engine)
        for key, extra in (("sk-chat-1", {}), ("sk-coder-1", {}), ("sk-plain-1", {}),
                           ("sk-coder-1", {"speculative": False}),
                           ("sk-plain-1", {"speculative": own}),
                           ("sk-coder-1", {"speculative": True})):
            status, body = await _post(h, key, **extra)
            assert status == 200, body
    assert [r.speculative for r in seen] == [server, TENANT, None, None,
                                             SpecConfig(3, 2, 2), TENANT]


@pytest.mark.asyncio(loop_scope="session")
async def test_true_without_a_config_and_bad_values_are_400s(
        make_engine: EngineFactory) -> None:
    async with running(make_config(parse_tenants(YAML)), make_engine()) as h:
        for key, value, problem in (
                ("sk-chat-1", True, "none is set"),
                ("sk-plain-1", True, "none is set"),
                ("sk-chat-1", "yes", "expected a boolean or an object"),
                ("sk-chat-1", 3, "expected a boolean or an object"),
                ("sk-chat-1", {"num_speculative_tokens": 0}, "num_speculative_tokens"),
                ("sk-chat-1", {"num_speculative_tokens": 2, "method": "eagle"}, "ngram"),
                ("sk-chat-1", {"prompt_lookup_max": 2}, "needs num_speculative_tokens"),
                ("sk-chat-1", {"num_speculative_tokens": 2, "x": 1}, "unknown")):
            status, body = await _post(h, key, speculative=value)
            assert status == 400, (value, body)
            err = body["error"]
            assert err["param"] == "speculative" and problem in err["message"], (value, err)
            assert err["type"] == "invalid_request_error"


def test_the_flag_and_the_config_file_set_the_server_default() -> None:
    args = build_parser().parse_args(["serve", "--speculative-config",
                                      '{"method": "ngram", "num_speculative_tokens": 4, '
                                      '"prompt_lookup_max": 4, "prompt_lookup_min": 2}'])
    assert config_from_args(args).model.speculative_config == SERVER
    cfg = load_config(None, {"model.speculative_config": {"num_speculative_tokens": 4,
                                                          "prompt_lookup_max": 4,
                                                          "prompt_lookup_min": 2}})
    assert cfg.model.speculative_config == SERVER
    assert load_config(None, {}).model.speculative_config is None
    for bad in ('{"num_speculative_tokens": 4', '{"method": "medusa", '
                '"num_speculative_tokens": 4}', "[]"):
        with pytest.raises(ConfigError, match="model.speculative_config"):
            load_config(None, {"model.speculative_config": bad})


def test_a_tenants_setting_round_trips_and_bad_ones_name_the_field() -> None:
    coder = parse_tenants(YAML).tenant_named("coder")
    assert coder is not None and coder.speculative_config == TENANT
    assert tenant_from_dict(tenant_spec(coder)).speculative_config == TENANT
    with pytest.raises(TenantsFileError, match="speculative_config"):
        tenant_from_dict({"name": "x", "speculative_config": {"num_speculative_tokens": 99}})
    with pytest.raises(TenantsFileError, match="speculative_config"):
        tenant_from_dict({"name": "x", "speculative_config": True})
