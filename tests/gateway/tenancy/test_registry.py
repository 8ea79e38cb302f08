"""The running tenants: the file as the seed, admin edits on top (what wins), keys by hash,
revocation, reload, and the audit log, over a real SQLite file."""

from __future__ import annotations

from pathlib import Path

import pytest

from executors.types import Priority
from gateway.errors import ApiError
from gateway.tenancy.keys import hash_key, key_id
from gateway.tenancy.registry import TenantRegistry
from gateway.tenancy.store import TenantStore
from gateway.tenants import Tenant, load_tenants, parse_tenants

FILE = """\
admin_keys: [sk-admin]
tenants:
  - {name: ide, api_keys: [sk-ide], priority: high}
  - {name: chat, api_key_sha256: [SHA]}
""".replace("SHA", hash_key("sk-chat"))
ADMIN = "admin:" + key_id(hash_key("sk-admin"))


@pytest.fixture
def registry(tmp_path: Path) -> TenantRegistry:
    path = tmp_path / "tenants.yaml"
    path.write_text(FILE)
    reg = TenantRegistry(load_tenants(path), str(path))
    reg.open(TenantStore(tmp_path / "db.sqlite"))
    return reg


def reopen(tmp_path: Path) -> TenantRegistry:
    path = tmp_path / "tenants.yaml"
    reg = TenantRegistry(load_tenants(path), str(path))
    reg.open(TenantStore(tmp_path / "db.sqlite"))
    return reg


def test_hashed_and_plain_keys_authenticate(registry: TenantRegistry) -> None:
    current = registry.current
    assert current.tenant_for("sk-chat") is current.tenant_named("chat")
    assert current.tenant_for("sk-ide") is current.tenant_named("ide")
    assert current.tenant_for("sk-chat ") is None and current.tenant_for("sk-ide2") is None
    assert current.is_admin("sk-admin") and not current.is_admin("sk-ide")
    assert hash_key("sk-ide") not in repr(current)  # hashes only; never the key
    assert "sk-ide" not in repr(current)


def test_admin_edits_win_over_the_file_and_survive_a_restart(registry: TenantRegistry,
                                                              tmp_path: Path) -> None:
    ide = registry.require("ide")
    registry.update(ADMIN, Tenant("ide", priority=Priority.LOW, max_concurrency=3),
                    {"priority": "low", "max_concurrency": 3})
    registry.create(ADMIN, Tenant("new", (hash_key("sk-new"),)))
    registry.delete(ADMIN, "chat")
    (tmp_path / "tenants.yaml").write_text(FILE.replace("priority: high", "priority: normal")
                                           + "  - {name: extra, api_keys: [sk-extra]}\n")
    entry = registry.reload("signal:SIGHUP")
    assert entry.detail["added"] == ["extra"] and entry.detail["changed"] == []
    again = reopen(tmp_path)
    for reg in (registry, again):
        current = reg.current
        assert [t.name for t in current.tenants] == ["ide", "extra", "new"]
        now_ide = current.tenant_named("ide")
        assert now_ide is not None and now_ide.priority is Priority.LOW
        assert now_ide.key_hashes == ide.key_hashes  # the file's keys stay
        assert current.tenant_for("sk-chat") is None  # deleted: its keys revoked
        assert current.tenant_for("sk-new") is current.tenant_named("new")


def test_a_revoked_key_stays_revoked_whatever_the_file_says(registry: TenantRegistry,
                                                             tmp_path: Path) -> None:
    registry.revoke_key(ADMIN, "ide", key_id(hash_key("sk-ide")))
    assert registry.current.tenant_for("sk-ide") is None
    (tmp_path / "tenants.yaml").write_text(FILE.replace("[sk-ide]", "[sk-ide, sk-ide-2]"))
    registry.reload(ADMIN)
    assert registry.current.tenant_for("sk-ide") is None
    assert registry.current.tenant_for("sk-ide-2") is registry.current.tenant_named("ide")
    with pytest.raises(ApiError) as info:  # nor can it be added again, to anyone
        registry.add_key(ADMIN, "chat", hash_key("sk-ide"))
    assert info.value.status == 409


def test_conflicts_and_bad_files_change_nothing(registry: TenantRegistry,
                                                tmp_path: Path) -> None:
    before = registry.current
    registry.add_key(ADMIN, "chat", hash_key("sk-two"))
    with pytest.raises(ApiError) as info:
        registry.create(ADMIN, Tenant("ide"))
    assert info.value.status == 409
    for text in ("tenants: [{name: x}]\n",  # no key
                 FILE + "  - {name: dup, api_keys: [sk-two]}\n"):  # an admin-added key
        (tmp_path / "tenants.yaml").write_text(text)
        with pytest.raises(ApiError) as info:
            registry.reload(ADMIN)
        assert info.value.status == 400
    assert registry.current.tenant_for("sk-two") is registry.current.tenant_named("chat")
    assert [t.name for t in registry.current.tenants] == [t.name for t in before.tenants]
    with pytest.raises(ApiError) as info:
        registry.revoke_key(ADMIN, "chat", "key-0000000000000000")
    assert info.value.status == 404


def test_every_change_is_audited(registry: TenantRegistry) -> None:
    registry.create(ADMIN, Tenant("a", (hash_key("sk-a"),)))
    registry.revoke_key(ADMIN, "a", key_id(hash_key("sk-a")))
    registry.reload("signal:SIGHUP")
    log = registry.store.audit_log(10)
    assert [(e.action, e.actor, e.tenant) for e in log] == [
        ("tenants.reload", "signal:SIGHUP", None), ("key.revoke", ADMIN, "a"),
        ("tenant.create", ADMIN, "a")]
    assert log[1].detail == {"key_id": key_id(hash_key("sk-a"))} and log[0].at > 0
    assert [e.seq for e in registry.store.audit_log(10, before=log[0].seq, tenant="a")] == [
        log[1].seq, log[2].seq]


def test_swaps_are_whole_configs(registry: TenantRegistry) -> None:
    seen = []
    registry.on_swap(seen.append)
    old = registry.current
    registry.add_key(ADMIN, "ide", hash_key("sk-ide-3"))
    assert seen == [old, registry.current] and old.tenant_for("sk-ide-3") is None
    assert parse_tenants(FILE).tenant_named("chat") == old.tenant_named("chat")
