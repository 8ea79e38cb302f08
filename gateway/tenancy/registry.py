"""The running tenants: one immutable `TenantsConfig`, replaced whole on every change.

Requests read `registry.current` once, when they authenticate, and keep that tenant to
the end: a change never touches a request in flight, so a revoked key's streams finish
while its next request gets 401. Every change (admin API, reload) is checked by merging
it with the file (`merge.merge`) before anything is written; then the store commits it
with its audit row and the new config is swapped in. Changes run on the event loop, one
at a time.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

from gateway.errors import ApiError
from gateway.tenancy.keys import key_id as key_id_of
from gateway.tenancy.merge import changed_tenants, merge
from gateway.tenancy.store import AuditEntry, KeyRecord, TenantStore
from gateway.tenants import Tenant, TenantsConfig, TenantsFileError, load_tenants, tenant_spec

logger = logging.getLogger("gateway.tenants")


class TenantRegistry:
    """The live tenants of one app (`AppState.tenants`); the file seeds it, the store edits it."""

    def __init__(self, seed: TenantsConfig, file_path: str | None,
                 clock: Callable[[], float] = time.time) -> None:
        self._file = seed  # the file as last read successfully
        self._path = file_path
        self._current = seed
        self._store: TenantStore | None = None
        self._clock = clock
        self._listeners: list[Callable[[TenantsConfig], None]] = []

    @property
    def current(self) -> TenantsConfig:
        return self._current

    @property
    def file_config(self) -> TenantsConfig:
        return self._file

    def on_swap(self, listener: Callable[[TenantsConfig], None]) -> None:
        """Call `listener` with every new config (and now with the current one)."""
        self._listeners.append(listener)
        listener(self._current)

    def open(self, store: TenantStore) -> None:
        """Apply the store's edits to the file's tenants (at start-up)."""
        self._store = store
        config = self._merged(self._file, store)
        if config != self._current:
            logger.info("tenants: %s after the admin edits kept in the data dir",
                        _summary(changed_tenants(self._current, config)))
        self._swap(config)

    def close(self) -> TenantStore | None:
        """Stop using the store (changes get 503 from now on); the store, to close."""
        store, self._store = self._store, None
        return store

    @property
    def store(self) -> TenantStore:
        if self._store is None:
            raise ApiError(503, "The tenant store is not open (the server is starting or "
                                "stopping).", code="unavailable")
        return self._store

    def reload(self, actor: str) -> AuditEntry:
        """Re-read the tenants file and apply it (400/409 ApiError, and nothing changes, when
        the file is invalid or clashes with the admin edits)."""
        if self._path is None:
            raise ApiError(400, "The server was started without a tenants file (--tenants); "
                                "there is nothing to reload.", code="no_tenants_file")
        try:
            file = load_tenants(self._path)
            config = self._merged(file, self.store)
        except (TenantsFileError, ValueError) as exc:
            logger.error("tenants: reload by %s failed, the running tenants are unchanged: %s",
                         actor, exc)
            raise ApiError(400, f"Tenants not reloaded: {exc}", code="invalid_tenants_file"
                           ) from None
        detail: dict[str, Any] = {"file": self._path,
                                  **changed_tenants(self._current, config)}
        entry = self._record(actor, "tenants.reload", None, detail)
        self._file = file
        self._swap(config)
        return entry

    def create(self, actor: str, tenant: Tenant) -> AuditEntry:
        """Add a tenant with `tenant.key_hashes` as its keys (409 if the name is taken)."""
        if self._current.tenant_named(tenant.name) is not None:
            raise ApiError(409, f"A tenant named {tenant.name!r} exists already.",
                           param="name", code="tenant_exists")
        self._check_new_keys(tenant.key_hashes)
        now = self._clock()
        keys = [KeyRecord(h, tenant.name, "admin", now, actor) for h in tenant.key_hashes]
        detail = {"fields": tenant_spec(tenant), "keys": [k.key_id for k in keys]}
        return self._apply(actor, "tenant.create", tenant.name, detail,
                           {tenant.name: tenant_spec(tenant)}, keys)

    def update(self, actor: str, tenant: Tenant, changes: dict[str, Any]) -> AuditEntry:
        """Replace a tenant's fields (its keys stay); `changes` is what the admin sent."""
        self.require(tenant.name)
        return self._apply(actor, "tenant.update", tenant.name, {"changes": changes},
                           {tenant.name: tenant_spec(tenant)}, [])

    def delete(self, actor: str, name: str) -> AuditEntry:
        """Remove a tenant; all its keys are revoked, so none comes back with the name."""
        tenant = self.require(name)
        now = self._clock()
        revoked = [self._revoked(h, name, actor, now) for h in tenant.key_hashes]
        return self._apply(actor, "tenant.delete", name,
                           {"revoked_keys": [k.key_id for k in revoked]}, {name: None}, revoked)

    def add_key(self, actor: str, name: str, key_hash: str) -> KeyRecord:
        self.require(name)
        self._check_new_keys((key_hash,))
        record = KeyRecord(key_hash, name, "admin", self._clock(), actor)
        self._apply(actor, "key.create", name, {"key_id": record.key_id}, {}, [record])
        return record

    def revoke_key(self, actor: str, name: str, key_id: str) -> KeyRecord:
        tenant = self.require(name)
        key_hash = next((h for h in tenant.key_hashes if key_id_of(h) == key_id), None)
        if key_hash is None:
            raise ApiError(404, f"Tenant {name!r} has no active key {key_id!r}.",
                           param="key_id", code="key_not_found")
        record = self._revoked(key_hash, name, actor, self._clock())
        self._apply(actor, "key.revoke", name, {"key_id": key_id}, {}, [record])
        return record

    def require(self, name: str) -> Tenant:
        tenant = self._current.tenant_named(name)
        if tenant is None:
            raise ApiError(404, f"No tenant named {name!r}.", param="name",
                           code="tenant_not_found")
        return tenant

    def key_records(self) -> dict[str, KeyRecord]:
        """Key hash -> its record in the store (keys added or revoked through the API)."""
        return {k.sha256: k for k in self.store.key_records()}

    # ---- internals ---------------------------------------------------------------------

    def _merged(self, file: TenantsConfig, store: TenantStore) -> TenantsConfig:
        return merge(file, store.overrides(), store.key_records())

    def _check_new_keys(self, hashes: tuple[str, ...]) -> None:
        known = {h for t in self._current.tenants for h in t.key_hashes}
        known |= set(self._current.admin_key_hashes) | set(self.key_records())
        known |= {h for t in self._file.tenants for h in t.key_hashes}
        if len(set(hashes)) != len(hashes) or known & set(hashes):
            raise ApiError(409, "This API key is, or was, in use; use a new key.",
                           param="api_key", code="key_exists")

    def _revoked(self, key_hash: str, tenant: str, actor: str, now: float) -> KeyRecord:
        old = self.key_records().get(key_hash)
        if old is not None:
            return dataclasses.replace(old, revoked_at=now, revoked_by=actor)
        return KeyRecord(key_hash, tenant, "file", now, "file", now, actor)

    def _apply(self, actor: str, action: str, tenant: str, detail: dict[str, Any],
               overrides: dict[str, dict[str, Any] | None],
               keys: list[KeyRecord]) -> AuditEntry:
        store = self.store
        all_keys = {k.sha256: k for k in store.key_records()} | {k.sha256: k for k in keys}
        try:
            config = merge(self._file, store.overrides() | overrides, all_keys.values())
        except (TenantsFileError, ValueError) as exc:
            raise ApiError(409, f"The change conflicts with the tenants: {exc}",
                           code="conflict") from None
        entry = self._record(actor, action, tenant, detail, overrides, keys)
        self._swap(config)
        return entry

    def _record(self, actor: str, action: str, tenant: str | None, detail: dict[str, Any],
                overrides: dict[str, dict[str, Any] | None] | None = None,
                keys: list[KeyRecord] | None = None) -> AuditEntry:
        entry = self.store.commit(actor, action, tenant, detail, overrides, keys or [],
                                  self._clock())
        logger.info("tenants: %s%s by %s: %s", action, f" {tenant!r}" if tenant else "",
                    actor, detail)
        return entry

    def _swap(self, config: TenantsConfig) -> None:
        self._current = config
        for listener in self._listeners:
            listener(config)


def _summary(changes: dict[str, list[str]]) -> str:
    return ", ".join(f"{what}: {', '.join(names)}" for what, names in changes.items()
                     if names) or "no change"
