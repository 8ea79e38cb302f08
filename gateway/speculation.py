"""Prompt-lookup speculative decoding settings: server-wide, per tenant, per request.

- Server: `--speculative-config JSON` (vLLM's flag; `model.speculative_config` in a
  config file, a JSON string or a mapping). Off when absent.
- Tenant: `speculative_config:` in the tenants file, a mapping (that config for its
  requests) or `false` (never for its requests); absent: the server's.
- Request: the extra body field `speculative` (vLLM has none): `false` (off), `true`
  (the tenant's or server's config; 400 when there is none) or an object of vLLM's fields
  (that config). Absent: the tenant's or server's.

The most specific one that is set wins: request, then tenant, then server.
"""

from __future__ import annotations

from typing import Any

from gateway.errors import clip, invalid
from gateway.fields import Fields
from models.spec_config import SpecConfig

Setting = SpecConfig | bool | None  # a config, False = off, True = the default; None = unset


def parse_setting(value: Any, allow_off: bool = False) -> SpecConfig | bool | None:
    """A server or tenant setting: a JSON string or mapping (or `false` with `allow_off`);
    raises ValueError saying what is wrong."""
    if value is None:
        return None
    if value is False and allow_off:
        return False
    if isinstance(value, str):
        return SpecConfig.from_json(value)
    if isinstance(value, dict):
        return SpecConfig.from_dict(value)
    raise ValueError("a speculative config is a JSON object of method, num_speculative_tokens, "
                     "prompt_lookup_max, prompt_lookup_min" + (" or false" if allow_off else ""))


def parse_request(fields: Fields) -> Setting:
    """The body's `speculative` field (400 on anything else than a boolean or an object)."""
    value = fields.body.get("speculative")
    if value is None or isinstance(value, bool):
        return value
    param = fields.name("speculative")
    if not isinstance(value, dict):
        raise invalid(param, f"Invalid type for '{param}': expected a boolean or an object, "
                             f"but got {clip(value)} instead.", code="invalid_type")
    try:
        return SpecConfig.from_dict(value)
    except ValueError as exc:
        raise invalid(param, f"Invalid '{param}': {exc}.", code="invalid_value") from None


def resolve(request: Setting, tenant: Setting, server: SpecConfig | None) -> SpecConfig | None:
    """The config a request runs with (module docstring); 400 when it asks for the default
    and there is none."""
    if isinstance(request, SpecConfig):
        return request
    default = tenant if isinstance(tenant, SpecConfig) else None if tenant is False else server
    if request is True and default is None:
        raise invalid("speculative", "Invalid 'speculative': true asks for the server's or "
                                     "tenant's speculative config, and none is set "
                                     "(pass an object instead).", code="invalid_value")
    return None if request is False else default
