"""What wins: the running tenants are the file's, with the admin edits of the store on top.

- A tenant an admin created, changed or deleted through the API is the store's version,
  whatever the file says about it later (its fields as set, or gone); every other tenant
  is exactly the file's.
- A tenant's keys are the file's and those added through the API, less every revoked key:
  a revoked key stays revoked even if the file still (or again) lists it, for any tenant.
- Admin keys come from the file only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from gateway.tenancy.store import KeyRecord
from gateway.tenants import Tenant, TenantsConfig, tenant_from_dict


def merge(file: TenantsConfig, overrides: Mapping[str, dict[str, Any] | None],
          keys: Iterable[KeyRecord]) -> TenantsConfig:
    """The running config; raises ValueError where the result is inconsistent (a key of two
    tenants) or TenantsFileError where a stored tenant no longer validates."""
    records = list(keys)
    revoked = {k.sha256 for k in records if not k.active}
    added: dict[str, list[str]] = {}
    for k in records:
        if k.active and k.source == "admin":
            added.setdefault(k.tenant, []).append(k.sha256)
    tenants: list[Tenant] = []
    for t in file.tenants:
        if t.name in overrides:
            spec = overrides[t.name]
            if spec is None:
                continue
            t = dataclasses.replace(tenant_from_dict(spec), key_hashes=t.key_hashes)
        file_keys = [h for h in t.key_hashes if h not in revoked]
        tenants.append(dataclasses.replace(t, key_hashes=(*file_keys, *added.get(t.name, ()))))
    in_file = {t.name for t in file.tenants}
    for name, spec in overrides.items():
        if name not in in_file and spec is not None:
            tenant = tenant_from_dict(spec)
            tenants.append(dataclasses.replace(tenant, key_hashes=tuple(added.get(name, ()))))
    return TenantsConfig(tuple(tenants), file.admin_key_hashes, file.default_priority)


def key_sources(file: TenantsConfig) -> dict[str, str]:
    """Key hash -> the tenant whose file entry lists it."""
    return {h: t.name for t in file.tenants for h in t.key_hashes}


def changed_tenants(old: TenantsConfig, new: TenantsConfig) -> dict[str, list[str]]:
    """Tenant names added, removed and changed (fields or keys) from `old` to `new`."""
    before = {t.name: t for t in old.tenants}
    after = {t.name: t for t in new.tenants}
    return {"added": sorted(after.keys() - before.keys()),
            "removed": sorted(before.keys() - after.keys()),
            "changed": sorted(n for n in before.keys() & after.keys() if before[n] != after[n])}
