"""Tenants: API keys -> name, priority class, TTFT/TPOT SLOs and quotas; auth; priority lowering.

The tenants file (YAML)::

    admin_keys: [sk-admin-1]    # or admin_key_sha256: [<hex SHA-256 of the key>]
    tenants:
      - name: ide
        api_keys: [sk-ide-1]    # and/or api_key_sha256: [...]; at least one key
        priority: high          # high | normal | low (default normal)
        ttft_slo_ms: 500        # omitted: best effort
        tpot_slo_ms: 50         # inter-token target once streaming; omitted: no pace kept
        max_concurrency: 64     # omitted limits mean unlimited
        requests_per_minute: 600
        tokens_per_minute: 200000
        share_prefix_cache: true   # default false: no other tenant hits its cached prompt
                                   # blocks (nor it theirs), so none can time-probe them
        budget: {daily_tokens: 1000000, monthly_tokens: 20000000, completion_weight: 2}
        models: [base, sql-lora]  # the models and LoRA adapters it may use (absent: all)
        default_model: sql-lora   # what a request without `model` runs on (absent: the base)
        speculative_config: {num_speculative_tokens: 4, prompt_lookup_max: 4}  # or false
                                  # (absent: the server's; docs/speculation.md)

Without a tenants file auth is off and every request belongs to one default
tenant (class `high`, so that a request can still choose any class by lowering).
Keys are kept only as SHA-256 hashes, looked up by hash and compared in constant time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import yaml

from executors.types import Priority
from gateway.errors import ApiError, clip, invalid
from gateway.logs import note_request
from gateway.speculation import parse_setting
from gateway.tenancy.budget import Budget
from gateway.tenancy.keys import hash_key, is_sha256, same_hash
from gateway.yamlmarks import LineDict, LineList, line_of, load_with_lines
from models.spec_config import SpecConfig

SERVICE_TIERS = ("auto", "default", "flex", "priority")
_TENANT_FIELDS = ("name", "api_keys", "api_key_sha256", "priority", "ttft_slo_ms", "tpot_slo_ms",
                  "max_concurrency", "requests_per_minute", "tokens_per_minute",
                  "share_prefix_cache", "budget", "models", "default_model",
                  "speculative_config")
_MAX_NUMBER = 1 << 62  # larger limits are typos (and SQLite's integers end at 2**63)
_BUDGET_FIELDS = ("daily_tokens", "monthly_tokens", "prompt_weight", "completion_weight")
_LIMIT_FIELDS = ("max_concurrency", "requests_per_minute", "tokens_per_minute")


@dataclass(frozen=True, slots=True)
class Tenant:
    """One tenant. Limits of None mean unlimited."""

    name: str
    key_hashes: tuple[str, ...] = field(default=(), repr=False)  # hex SHA-256 of each key
    priority: Priority = Priority.NORMAL
    ttft_slo_ms: float | None = None
    max_concurrency: int | None = None
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    share_prefix_cache: bool = False  # False: its KV blocks are keyed with its name too
    budget: Budget | None = None  # token limits per UTC day and month
    models: tuple[str, ...] | None = None  # model and adapter names it may use; None: all
    default_model: str | None = None  # for requests without `model`; None: the base model
    tpot_slo_ms: float | None = None  # inter-token target of its streams; None: no pace kept
    # prompt-lookup drafting for its requests: a config, False (never) or None (the server's)
    speculative_config: SpecConfig | bool | None = None

    def __post_init__(self) -> None:
        if (self.default_model is not None and self.models is not None
                and self.default_model not in self.models):
            raise ValueError(f"default_model {self.default_model!r} is not in models")

    def may_use(self, *names: str) -> bool:
        """Whether its `models` list names any of `names` (a model's name and aliases)."""
        return self.models is None or any(n in self.models for n in names)

    @property
    def cache_salt(self) -> str:
        """What keys its requests' blocks in the prefix cache ("" is shared by all)."""
        return "" if self.share_prefix_cache else f"tenant:{self.name}"

    @property
    def ttft_slo_s(self) -> float | None:
        return None if self.ttft_slo_ms is None else self.ttft_slo_ms / 1000.0

    @property
    def tpot_slo_s(self) -> float | None:
        return None if self.tpot_slo_ms is None else self.tpot_slo_ms / 1000.0


@dataclass(frozen=True, slots=True)
class TenantsConfig:
    """All tenants and admin keys. No tenants and no admin keys means auth is off."""

    tenants: tuple[Tenant, ...] = ()
    admin_key_hashes: tuple[str, ...] = field(default=(), repr=False)  # SHA-256 of each
    default_priority: Priority = Priority.HIGH  # class of the tenant used when auth is off
    _by_hash: dict[str, Tenant] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = [t.name for t in self.tenants]
        if len(set(names)) != len(names):
            raise ValueError("tenant names must be unique")
        by_hash: dict[str, Tenant] = {}
        for tenant in self.tenants:
            for key_hash in tenant.key_hashes:
                if key_hash in by_hash or key_hash in self.admin_key_hashes:
                    raise ValueError(f"an API key of tenant {tenant.name!r} is used twice")
                by_hash[key_hash] = tenant
        object.__setattr__(self, "_by_hash", by_hash)

    @property
    def auth_enabled(self) -> bool:
        return bool(self.tenants or self.admin_key_hashes)

    @property
    def default_tenant(self) -> Tenant:
        return Tenant("default", priority=self.default_priority)

    def tenant_named(self, name: str) -> Tenant | None:
        return next((t for t in self.tenants if t.name == name), None)

    def tenant_for(self, key: str) -> Tenant | None:
        """The tenant of a plain-text key. NOTE: looked up by its hash, so how long the lookup
        takes tells nothing about the stored keys; the match is confirmed in constant time."""
        key_hash = hash_key(key)
        tenant = self._by_hash.get(key_hash)
        if tenant is None or not any(same_hash(key_hash, h) for h in tenant.key_hashes):
            return None
        return tenant

    def is_admin(self, key: str) -> bool:
        key_hash = hash_key(key)
        return any([same_hash(key_hash, h) for h in self.admin_key_hashes])  # all compared


# ---- authentication ------------------------------------------------------------------------


def bearer_key(authorization: str | None) -> str | None:
    """The key of an `Authorization: Bearer KEY` header, or None."""
    if not authorization:
        return None
    scheme, _, key = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return key.strip() or None


def authenticate(tenants: TenantsConfig, authorization: str | None) -> Tenant:
    """The tenant a request belongs to (noted for its log line); 401 on a missing or
    unknown key."""
    if not tenants.auth_enabled:
        note_request(tenant=tenants.default_tenant.name)
        return tenants.default_tenant
    key = bearer_key(authorization)
    if key is None:
        raise ApiError(401, "Missing API key: send 'Authorization: Bearer YOUR_KEY'.",
                       code="invalid_api_key")
    tenant = tenants.tenant_for(key)
    if tenant is None:
        raise ApiError(401, "Incorrect API key provided.", code="invalid_api_key")
    note_request(tenant=tenant.name)
    return tenant


def authorize_admin(tenants: TenantsConfig, authorization: str | None) -> None:
    """Admin endpoints: 401 without a known key, 403 with a tenant's key."""
    if not tenants.auth_enabled:
        return
    key = bearer_key(authorization)
    if key is not None and tenants.is_admin(key):
        return
    if key is not None and tenants.tenant_for(key) is not None:
        raise ApiError(403, "This endpoint needs an admin key.", code="admin_key_required")
    raise ApiError(401, "Missing or incorrect admin key.", code="invalid_api_key")


# ---- priority ------------------------------------------------------------------------------


def priority_from_vllm(value: int) -> Priority:
    """vLLM's request `priority` (lower runs first): <= 0 high, 1 normal, >= 2 low."""
    return Priority.HIGH if value <= 0 else Priority.NORMAL if value == 1 else Priority.LOW


def effective_priority(tenant: Priority, header: str | None = None,
                       body_priority: int | None = None,
                       service_tier: str | None = None) -> Priority:
    """The tenant's class, lowered (never raised) by `X-Priority`, `priority`, `service_tier`."""
    requested = [tenant]
    if header is not None:
        try:
            requested.append(Priority.parse(header))
        except ValueError:
            raise invalid(None, f"Invalid X-Priority header {clip(header)}: use high, normal "
                                "or low.") from None
    if body_priority is not None:
        requested.append(priority_from_vllm(body_priority))
    if service_tier == "priority":
        requested.append(Priority.HIGH)
    elif service_tier == "flex":
        requested.append(Priority.LOW)
    return max(requested)  # NOTE: a larger value is a lower class, so max() only lowers.


# ---- the tenants file ----------------------------------------------------------------------


class TenantsFileError(ValueError):
    """An invalid tenants file; the message names the file, line and field."""


def load_tenants(path: str | Path) -> TenantsConfig:
    """Read and validate a tenants file (raises TenantsFileError)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise TenantsFileError(f"{path}: cannot read the tenants file: {exc}") from None
    return parse_tenants(text, str(path))


def parse_tenants(text: str, source: str = "<tenants>") -> TenantsConfig:
    """Validate the YAML text of a tenants file (raises TenantsFileError)."""
    try:
        doc = load_with_lines(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        problem = getattr(exc, "problem", None) or str(exc)
        raise TenantsFileError(f"{source}:{line}: invalid YAML: {problem}") from None
    reader = _Reader(source)
    if not isinstance(doc, LineDict):
        raise TenantsFileError(f"{source}:1: expected a mapping with 'tenants' and "
                               "'admin_keys'")
    reader.no_unknown(doc, ("tenants", "admin_keys", "admin_key_sha256"), "")
    admin_keys = (*reader.hashes(doc, "admin_keys", "admin_keys", hashed=False),
                  *reader.hashes(doc, "admin_key_sha256", "admin_key_sha256", hashed=True))
    raw = doc.get("tenants") or LineList()
    if not isinstance(raw, list):
        reader.fail(doc, "tenants", "tenants", "must be a list of tenants")
    tenants = [reader.tenant(raw, i, f"tenants[{i}]") for i in range(len(raw))]
    reader.check_unique(raw, tenants, admin_keys)
    return TenantsConfig(tuple(tenants), admin_keys)


def tenant_from_dict(item: Any, keys_required: bool = False) -> Tenant:
    """A tenant from a JSON object of the file's fields (the admin API's bodies);
    raises TenantsFileError naming the field."""
    reader = _Reader(None)
    return reader.tenant([item], 0, "tenant", keys_required=keys_required)


def tenant_spec(tenant: Tenant) -> dict[str, Any]:
    """A tenant's fields as the file writes them, keys left out (`tenant_from_dict` reads it)."""
    spec: dict[str, Any] = {"name": tenant.name, "priority": tenant.priority.label,
                            "ttft_slo_ms": tenant.ttft_slo_ms, "tpot_slo_ms": tenant.tpot_slo_ms}
    spec.update({k: getattr(tenant, k) for k in _LIMIT_FIELDS})
    spec["share_prefix_cache"] = tenant.share_prefix_cache
    spec["budget"] = None if tenant.budget is None else tenant.budget.as_dict()
    spec["models"] = None if tenant.models is None else list(tenant.models)
    spec["default_model"] = tenant.default_model
    s = tenant.speculative_config
    spec["speculative_config"] = s.to_dict() if isinstance(s, SpecConfig) else s
    return spec


class _Reader:
    """Field-by-field validation of a parsed tenants file, failing with file:line: field
    (with no source, as for an admin API body: field: problem)."""

    def __init__(self, source: str | None) -> None:
        self.source = source

    def fail(self, container: Any, key: Any, path: str, problem: str) -> NoReturn:
        if self.source is None:
            raise TenantsFileError(f"{path}: {problem}")
        line = line_of(container, key) or 1
        raise TenantsFileError(f"{self.source}:{line}: {path}: {problem}")

    def no_unknown(self, item: dict[str, Any], allowed: tuple[str, ...], prefix: str) -> None:
        for key in item:
            if key not in allowed:
                self.fail(item, key, f"{prefix}{key}",
                          f"unknown field; expected one of {', '.join(allowed)}")

    def hashes(self, item: dict[str, Any], key: str, path: str,
               hashed: bool) -> tuple[str, ...]:
        """The SHA-256 hashes of a list of plain-text keys, or a list of hashes checked."""
        value = item.get(key)
        if value is None:
            return ()
        if (not isinstance(value, list) or not value
                or not all(isinstance(k, str) and k.strip() for k in value)):
            self.fail(item, key, path, "must be a non-empty list of non-empty strings")
        if not hashed:
            return tuple(hash_key(k.strip()) for k in value)
        digests = tuple(k.strip().lower() for k in value)
        if not all(is_sha256(d) for d in digests):
            self.fail(item, key, path, "each entry must be a hex SHA-256 digest (64 hex "
                                       "digits, as `printf %s KEY | sha256sum` prints)")
        return digests

    def tenant(self, raw: list[Any], index: int, path: str, keys_required: bool = True) -> Tenant:
        item = raw[index]
        if not isinstance(item, dict):
            self.fail(raw, index, path, "must be a mapping with name, api_keys, priority, ...")
        self.no_unknown(item, _TENANT_FIELDS, f"{path}.")
        name = item.get("name")
        if not isinstance(name, str) or not name.strip():
            self.fail(item, "name", f"{path}.name", "required, a non-empty string")
        priority = Priority.NORMAL
        if item.get("priority") is not None:
            try:
                priority = Priority.parse(str(item["priority"]))
            except ValueError:
                self.fail(item, "priority", f"{path}.priority",
                          f"unknown priority {item['priority']!r}; use high, normal or low")
        limits = {k: self.positive(item, k, f"{path}.{k}", integer=True) for k in _LIMIT_FIELDS}
        slo = self.positive(item, "ttft_slo_ms", f"{path}.ttft_slo_ms", integer=False)
        tpot = self.positive(item, "tpot_slo_ms", f"{path}.tpot_slo_ms", integer=False)
        keys = (*self.hashes(item, "api_keys", f"{path}.api_keys", hashed=False),
                *self.hashes(item, "api_key_sha256", f"{path}.api_key_sha256", hashed=True))
        if keys_required and not keys:
            self.fail(item, "api_keys", f"{path}.api_keys",
                      "required: a non-empty list in api_keys or api_key_sha256")
        share = item.get("share_prefix_cache", False)
        if not isinstance(share, bool):
            self.fail(item, "share_prefix_cache", f"{path}.share_prefix_cache",
                      f"must be true or false, got {share!r}")
        models, default = self.models(item, path)
        return Tenant(str(name).strip(), keys, priority, slo, **limits,
                      share_prefix_cache=share, budget=self.budget(item, f"{path}.budget"),
                      models=models, default_model=default, tpot_slo_ms=tpot,
                      speculative_config=self.speculative(item, path))

    def speculative(self, item: dict[str, Any], path: str) -> SpecConfig | bool | None:
        try:
            return parse_setting(item.get("speculative_config"), allow_off=True)
        except ValueError as exc:
            self.fail(item, "speculative_config", f"{path}.speculative_config", str(exc))

    def models(self, item: dict[str, Any], path: str) -> tuple[tuple[str, ...] | None,
                                                                str | None]:
        """The tenant's `models` list and `default_model` (which must be in the list).
        NOTE: names are not checked against what is served: an adapter may be loaded later."""
        models, default = item.get("models"), item.get("default_model")
        if models is not None and (not isinstance(models, list) or not all(
                isinstance(m, str) and m.strip() for m in models)):
            self.fail(item, "models", f"{path}.models",
                      "must be a list of model or adapter names (absent: every model)")
        if default is not None and (not isinstance(default, str) or not default.strip()):
            self.fail(item, "default_model", f"{path}.default_model",
                      "must be a model or adapter name")
        names = None if models is None else tuple(dict.fromkeys(m.strip() for m in models))
        default = None if default is None else default.strip()
        if default is not None and names is not None and default not in names:
            self.fail(item, "default_model", f"{path}.default_model",
                      f"{default!r} is not in the tenant's models {list(names)}")
        return names, default

    def budget(self, item: dict[str, Any], path: str) -> Budget | None:
        value = item.get("budget")
        if value is None:
            return None
        if not isinstance(value, dict):
            self.fail(item, "budget", path, "must be a mapping with daily_tokens and/or "
                                            "monthly_tokens")
        self.no_unknown(value, _BUDGET_FIELDS, f"{path}.")
        limits = {k: self.positive(value, k, f"{path}.{k}", integer=True)
                  for k in _BUDGET_FIELDS[:2]}
        weights = {k: self.positive(value, k, f"{path}.{k}", integer=False)
                   for k in _BUDGET_FIELDS[2:]}
        return Budget(**limits, **{k: v for k, v in weights.items() if v is not None})

    def positive(self, item: dict[str, Any], key: str, path: str, integer: bool) -> Any:
        value: Any = item.get(key)
        if value is None:
            return None
        numeric = isinstance(value, int) or (isinstance(value, float) and not integer)
        if (isinstance(value, bool) or not numeric or not math.isfinite(value) or value <= 0
                or value > _MAX_NUMBER):
            kind = "integer" if integer else "number"
            self.fail(item, key, path, f"must be a positive {kind}, got {clip(value)}")
        return value

    def check_unique(self, raw: list[Any], tenants: list[Tenant],
                     admin_keys: tuple[str, ...]) -> None:
        seen_names: set[str] = set()
        seen_keys = set(admin_keys)
        for i, tenant in enumerate(tenants):
            if tenant.name in seen_names:
                self.fail(raw[i], "name", f"tenants[{i}].name", f"duplicate name {tenant.name!r}")
            seen_names.add(tenant.name)
            for key in tenant.key_hashes:
                if key in seen_keys:
                    self.fail(raw[i], "api_keys", f"tenants[{i}].api_keys",
                              "an API key is used twice (by another tenant or as admin key)")
                seen_keys.add(key)
