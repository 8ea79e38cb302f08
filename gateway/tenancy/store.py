"""Admin edits of tenants, their keys, the audit log and token spend, in the data dir's SQLite.

The tables live in the Batch API's database file (`slicegate.db`), on a connection of
their own. The tenants file stays the seed: this store holds only what admins changed
(`tenant_overrides`: a tenant's fields, or a deletion), keys added or revoked through the
API (`tenant_keys`, SHA-256 hashes only), who did what when (`tenant_audit`) and each
tenant's spend per UTC day and month (`tenant_spend`). Every change and its audit row
are one transaction.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from gateway.tenancy.keys import key_id

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tenant_overrides (
    name TEXT PRIMARY KEY, spec TEXT, updated_at REAL NOT NULL, updated_by TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tenant_keys (
    sha256 TEXT PRIMARY KEY, tenant TEXT NOT NULL, source TEXT NOT NULL,
    created_at REAL NOT NULL, created_by TEXT NOT NULL, revoked_at REAL, revoked_by TEXT);
CREATE TABLE IF NOT EXISTS tenant_audit (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, actor TEXT NOT NULL,
    action TEXT NOT NULL, tenant TEXT, detail TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tenant_spend (
    tenant TEXT NOT NULL, period TEXT NOT NULL, tokens INTEGER NOT NULL,
    PRIMARY KEY (tenant, period)) WITHOUT ROWID;
"""
_KEY_COLUMNS = ("sha256", "tenant", "source", "created_at", "created_by", "revoked_at",
                "revoked_by")


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """A key the API added (`source` "admin") or revoked (a file's key: `source` "file")."""

    sha256: str
    tenant: str
    source: str  # "admin" | "file"
    created_at: float  # wall-clock s
    created_by: str  # the actor (see `AuditEntry.actor`)
    revoked_at: float | None = None
    revoked_by: str | None = None

    @property
    def key_id(self) -> str:
        return key_id(self.sha256)

    @property
    def active(self) -> bool:
        return self.revoked_at is None


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One change: when, who (`admin:key-...`, `signal:SIGHUP`, `startup`), what."""

    seq: int
    at: float  # wall-clock s
    actor: str
    action: str  # e.g. tenant.create, key.revoke, tenants.reload
    tenant: str | None
    detail: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "at": self.at, "actor": self.actor, "action": self.action,
                "tenant": self.tenant, "detail": self.detail}


class TenantStore:
    """The tenant tables of one database file. Thread-safe (one connection behind a lock)."""

    def __init__(self, path: Path) -> None:
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # NOTE: as the batch store: no commit
        self._db.execute("PRAGMA busy_timeout=5000")   # is lost when the process is killed
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def overrides(self) -> dict[str, dict[str, Any] | None]:
        """Tenant name -> the fields an admin set, or None where an admin deleted it."""
        with self._lock:
            rows = self._db.execute("SELECT name, spec FROM tenant_overrides "
                                    "ORDER BY rowid").fetchall()
        return {name: None if spec is None else orjson.loads(spec) for name, spec in rows}

    def key_records(self) -> list[KeyRecord]:
        with self._lock:
            rows = self._db.execute(f"SELECT {', '.join(_KEY_COLUMNS)} FROM tenant_keys "
                                    "ORDER BY created_at, sha256").fetchall()
        return [KeyRecord(*row) for row in rows]

    def commit(self, actor: str, action: str, tenant: str | None, detail: dict[str, Any],
               overrides: Mapping[str, dict[str, Any] | None] | None = None,
               keys: Iterable[KeyRecord] = (), now: float = 0.0) -> AuditEntry:
        """Write overrides and key records (replacing those of the same name or hash) and
        their audit row, in one transaction."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for name, spec in (overrides or {}).items():
                    text = None if spec is None else orjson.dumps(spec).decode()
                    self._db.execute("INSERT OR REPLACE INTO tenant_overrides VALUES "
                                     "(?, ?, ?, ?)", (name, text, now, actor))
                for k in keys:
                    self._db.execute(f"INSERT OR REPLACE INTO tenant_keys VALUES "
                                     f"({', '.join('?' * len(_KEY_COLUMNS))})",
                                     tuple(getattr(k, c) for c in _KEY_COLUMNS))
                cursor = self._db.execute(
                    "INSERT INTO tenant_audit (at, actor, action, tenant, detail) "
                    "VALUES (?, ?, ?, ?, ?)", (now, actor, action, tenant,
                                               orjson.dumps(detail).decode()))
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        return AuditEntry(int(cursor.lastrowid or 0), now, actor, action, tenant, detail)

    def audit_log(self, limit: int, before: int | None = None,
                  tenant: str | None = None) -> list[AuditEntry]:
        """Newest first; `before` is the `seq` of the last entry of the previous page."""
        sql = "SELECT seq, at, actor, action, tenant, detail FROM tenant_audit WHERE 1"
        args: list[Any] = []
        if before is not None:
            sql, args = sql + " AND seq < ?", [*args, before]
        if tenant is not None:
            sql, args = sql + " AND tenant = ?", [*args, tenant]
        with self._lock:
            rows = self._db.execute(sql + " ORDER BY seq DESC LIMIT ?",
                                    [*args, limit]).fetchall()
        return [AuditEntry(s, at, who, what, t, orjson.loads(d)) for s, at, who, what, t, d
                in rows]

    def spend(self, periods: Sequence[str]) -> dict[tuple[str, str], int]:
        """(tenant, period) -> budget tokens spent, for the given period keys."""
        if not periods:
            return {}
        marks = ", ".join("?" * len(periods))
        with self._lock:
            rows = self._db.execute(f"SELECT tenant, period, tokens FROM tenant_spend "
                                    f"WHERE period IN ({marks})", tuple(periods)).fetchall()
        return {(t, p): n for t, p, n in rows}

    def add_spend(self, tenant: str, periods: Sequence[str], tokens: int) -> None:
        """Add `tokens` to the tenant's spend in each period (one transaction)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for p in periods:
                    self._db.execute("INSERT INTO tenant_spend VALUES (?, ?, ?) ON CONFLICT "
                                     "(tenant, period) DO UPDATE SET tokens = tokens + "
                                     "excluded.tokens", (tenant, p, tokens))
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
