"""`/admin/tenants`: list, add, change and remove tenants and their keys, reload the file,
read a tenant's budget usage, and `/admin/audit`, the log of every change.

Admin keys only (`authorize_admin`); changes need admin keys in the tenants file (with
auth off anyone could otherwise lock everyone out). A full key is sent back only when
the server generated it, once; keys are named by id (`key-` and 16 hex digits of their
SHA-256) everywhere else.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.errors import ApiError, invalid
from gateway.protocol import parse_json
from gateway.responses import json_response
from gateway.state import AppState, state_of
from gateway.tenancy.keys import generate_key, hash_key, is_sha256, key_id
from gateway.tenancy.store import KeyRecord
from gateway.tenants import (
    Tenant,
    TenantsFileError,
    authorize_admin,
    bearer_key,
    tenant_from_dict,
    tenant_spec,
)

router = APIRouter()

_KEY_FIELDS = ("api_keys", "api_key_sha256")
_AUDIT_PAGE = 100
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # fits a URL path segment as is
_AUDIT_MAX = 1000


def _admin(request: Request, change: bool = False) -> tuple[AppState, str]:
    """The app state and the actor (`admin:key-...`) of an authorized admin request."""
    state = state_of(request)
    current = state.tenants.current
    authorization = request.headers.get("authorization")
    authorize_admin(current, authorization)
    if change and not current.admin_key_hashes:
        raise ApiError(403, "Changing tenants needs admin keys: add admin_keys (or "
                            "admin_key_sha256) to the tenants file.", code="admin_key_required")
    key = bearer_key(authorization)
    return state, "admin:" + key_id(hash_key(key)) if key else "anonymous"


def _views(state: AppState, tenants: list[Tenant]) -> list[dict[str, Any]]:
    """Tenants as the API shows them: fields, where each comes from, its keys by id."""
    records = state.tenants.key_records()
    edited = state.tenants.store.overrides()
    file = state.tenants.file_config
    out = []
    for tenant in tenants:
        seed = file.tenant_named(tenant.name)
        from_file = set(seed.key_hashes) if seed is not None else set()
        keys = [_key_view(tenant.name, h, records.get(h), h in from_file)
                for h in tenant.key_hashes]
        out.append({"object": "tenant", **tenant_spec(tenant),
                    "source": "admin" if tenant.name in edited else "file", "keys": keys})
    return out


def _view(state: AppState, tenant: Tenant) -> dict[str, Any]:
    return _views(state, [tenant])[0]


def _key_view(tenant: str, key_hash: str, record: KeyRecord | None,
              from_file: bool) -> dict[str, Any]:
    source = "file" if from_file or record is None else record.source
    return {"object": "tenant.key", "id": key_id(key_hash), "tenant": tenant, "source": source,
            "created_at": None if record is None else int(record.created_at),
            "created_by": None if record is None else record.created_by}


def _tenant_body(body: dict[str, Any], keys_required: bool = False) -> Tenant:
    try:
        return tenant_from_dict(body, keys_required)
    except TenantsFileError as exc:
        field = str(exc).partition(":")[0].removeprefix("tenant.")
        raise invalid(field, f"Invalid tenant: {exc}".replace("tenant.", "", 1)) from None


@router.get("/admin/tenants")
async def list_tenants(request: Request) -> Response:
    state, _ = _admin(request)
    data = _views(state, list(state.tenants.current.tenants))
    return json_response({"object": "list", "data": data})


@router.post("/admin/tenants")
async def create_tenant(request: Request) -> Response:
    """A new tenant; without `api_keys`/`api_key_sha256` the server makes one key and answers
    it (`api_key`), this once."""
    state, actor = _admin(request, change=True)
    tenant = _tenant_body(parse_json(await request.body()))
    if not _NAME.fullmatch(tenant.name):
        raise invalid("name", "A tenant name is 1 to 64 letters, digits, '.', '_' or '-', "
                              "starting with a letter or digit.")
    generated = None
    if not tenant.key_hashes:
        generated = generate_key()
        tenant = Tenant(**{**_fields(tenant), "key_hashes": (hash_key(generated),)})
    state.tenants.create(actor, tenant)
    view = _view(state, state.tenants.require(tenant.name))
    if generated is not None:
        view["api_key"] = generated
    return json_response(view, status_code=201)


@router.post("/admin/tenants/reload")
async def reload_tenants(request: Request) -> Response:
    """Re-read the tenants file, as SIGHUP does; 400 (nothing changes) when it is invalid."""
    state, actor = _admin(request, change=True)
    entry = state.tenants.reload(actor)
    return json_response({"object": "tenants.reload", **entry.detail,
                          "tenants": len(state.tenants.current.tenants)})


@router.get("/admin/tenants/{name}")
async def get_tenant(request: Request, name: str) -> Response:
    state, _ = _admin(request)
    return json_response(_view(state, state.tenants.require(name)))


@router.patch("/admin/tenants/{name}")
async def update_tenant(request: Request, name: str) -> Response:
    """Change fields (null clears a limit; `budget` is replaced whole); keys have their own
    endpoints."""
    state, actor = _admin(request, change=True)
    changes = parse_json(await request.body())
    current = state.tenants.require(name)
    for field in _KEY_FIELDS:
        if field in changes:
            raise invalid(field, f"Keys are not changed by PATCH: POST /admin/tenants/{name}"
                                 "/keys adds one, DELETE .../keys/{key_id} revokes one.")
    if changes.get("name", name) != name:
        raise invalid("name", "A tenant cannot be renamed; create a new one.")
    tenant = _tenant_body({**tenant_spec(current), **changes})
    state.tenants.update(actor, tenant, changes)
    return json_response(_view(state, state.tenants.require(name)))


@router.delete("/admin/tenants/{name}")
async def delete_tenant(request: Request, name: str) -> Response:
    """Remove a tenant and revoke its keys; its requests in flight finish."""
    state, actor = _admin(request, change=True)
    state.tenants.delete(actor, name)
    return json_response({"object": "tenant.deleted", "name": name, "deleted": True})


@router.post("/admin/tenants/{name}/keys")
async def add_key(request: Request, name: str) -> Response:
    """Add a key: `{"api_key": ...}`, `{"api_key_sha256": ...}`, or `{}` for one the server
    makes (answered once as `api_key`)."""
    state, actor = _admin(request, change=True)
    body = parse_json(await request.body())
    unknown = set(body) - {"api_key", "api_key_sha256"}
    if unknown or len(body) > 1:
        raise invalid(None, "Send one of api_key or api_key_sha256, or an empty object for "
                            "a key the server makes.")
    generated = None if body else generate_key()
    key_hash = _key_hash(body) if body else hash_key(generated or "")
    record = state.tenants.add_key(actor, name, key_hash)
    view = _key_view(name, key_hash, record, False)
    if generated is not None:
        view["api_key"] = generated
    return json_response(view, status_code=201)


def _key_hash(body: dict[str, Any]) -> str:
    if "api_key" in body:
        key = body["api_key"]
        if not isinstance(key, str) or not key.strip() or len(key) > 1024:
            raise invalid("api_key", "api_key must be a non-empty string.")
        return hash_key(key.strip())
    digest = body["api_key_sha256"]
    if not isinstance(digest, str) or not is_sha256(digest.strip().lower()):
        raise invalid("api_key_sha256", "api_key_sha256 must be a hex SHA-256 digest.")
    return digest.strip().lower()


@router.delete("/admin/tenants/{name}/keys/{key}")
async def revoke_key(request: Request, name: str, key: str) -> Response:
    """Revoke a key: refused at once, its requests in flight finish."""
    state, actor = _admin(request, change=True)
    record = state.tenants.revoke_key(actor, name, key)
    return json_response({"object": "tenant.key.deleted", "id": record.key_id, "tenant": name,
                          "deleted": True})


@router.get("/admin/tenants/{name}/usage")
async def tenant_usage(request: Request, name: str) -> Response:
    """Budget tokens spent and left in the current UTC day and month."""
    state, _ = _admin(request)
    tenant = state.tenants.require(name)
    usage = {u.window: u.as_dict() for u in state.budgets.usage(tenant)}
    budget = None if tenant.budget is None else tenant.budget.as_dict()
    return json_response({"object": "tenant.usage", "tenant": name, "budget": budget, **usage})


@router.get("/admin/audit")
async def audit_log(request: Request) -> Response:
    """Changes of tenants and keys, newest first (`limit`, `before` a seq, `tenant`)."""
    state, _ = _admin(request)
    params = request.query_params
    limit = _int_param(params.get("limit"), "limit", _AUDIT_PAGE)
    if not 1 <= limit <= _AUDIT_MAX:
        raise invalid("limit", f"limit must be between 1 and {_AUDIT_MAX}.")
    before = _int_param(params.get("before"), "before", None)
    entries = state.tenants.store.audit_log(limit + 1, before, params.get("tenant"))
    return json_response({"object": "list", "data": [e.as_dict() for e in entries[:limit]],
                          "has_more": len(entries) > limit})


def _int_param(raw: str | None, name: str, default: int | None) -> Any:
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise invalid(name, f"{name} must be an integer.") from None


def _fields(tenant: Tenant) -> dict[str, Any]:
    return {f: getattr(tenant, f) for f in Tenant.__dataclass_fields__}
