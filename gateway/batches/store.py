"""Files, batches and per-line results in SQLite (WAL), safe to kill at any instant.

Every change that must survive a crash is one transaction: a line's result
is recorded only while the line is still pending (`record_line`), so a line
re-run after a restart can never be answered twice; a batch's result files
and its terminal status are committed together (`finish_batch`).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson

from gateway.batches.lines import Line
from gateway.batches.types import BatchRecord, BatchStatus, FileRecord, LineState

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, filename TEXT NOT NULL, purpose TEXT NOT NULL,
    bytes INTEGER NOT NULL, created_at INTEGER NOT NULL, num_lines INTEGER NOT NULL,
    urls TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS batches (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL, tenant TEXT NOT NULL,
    input_file_id TEXT NOT NULL, endpoint TEXT NOT NULL, completion_window TEXT NOT NULL,
    status TEXT NOT NULL, created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL,
    total INTEGER NOT NULL DEFAULT 0, completed INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0, in_progress_at INTEGER, finalizing_at INTEGER,
    completed_at INTEGER, failed_at INTEGER, expired_at INTEGER, cancelling_at INTEGER,
    cancelled_at INTEGER, output_file_id TEXT, error_file_id TEXT, errors TEXT,
    metadata TEXT, final_status TEXT);
CREATE TABLE IF NOT EXISTS lines (
    batch_id TEXT NOT NULL, line_no INTEGER NOT NULL, custom_id TEXT NOT NULL, body TEXT,
    state TEXT NOT NULL, result TEXT, PRIMARY KEY (batch_id, line_no)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS lines_state ON lines (batch_id, state, line_no);
"""

_BATCH_COLUMNS = ("id", "tenant", "input_file_id", "endpoint", "completion_window", "status",
                  "created_at", "expires_at", "total", "completed", "failed", "in_progress_at",
                  "finalizing_at", "completed_at", "failed_at", "expired_at", "cancelling_at",
                  "cancelled_at", "output_file_id", "error_file_id", "errors", "metadata",
                  "final_status")
_FILE_COLUMNS = ("id", "tenant", "filename", "purpose", "bytes", "created_at", "num_lines",
                 "urls")
_SELECT_BATCH = f"SELECT {', '.join(_BATCH_COLUMNS)} FROM batches"
_SELECT_FILE = f"SELECT {', '.join(_FILE_COLUMNS)} FROM files"


def _batch(row: Sequence[Any]) -> BatchRecord:
    values = dict(zip(_BATCH_COLUMNS, row, strict=True))
    values["status"] = BatchStatus(values["status"])
    final = values["final_status"]
    values["final_status"] = BatchStatus(final) if final else None
    values["errors"] = tuple(orjson.loads(values["errors"])) if values["errors"] else ()
    values["metadata"] = orjson.loads(values["metadata"]) if values["metadata"] else None
    return BatchRecord(**values)


def _file(row: Sequence[Any]) -> FileRecord:
    values = dict(zip(_FILE_COLUMNS, row, strict=True))
    values["urls"] = tuple(orjson.loads(values["urls"]))
    return FileRecord(**values)


class Store:
    """The SQLite database of one data dir. Thread-safe (one connection behind a lock)."""

    def __init__(self, path: Path) -> None:
        # NOTE: synchronous=NORMAL in WAL mode loses no commit when the process is killed
        # (only on a power cut), and keeps a commit at tens of microseconds.
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _tx(self, work: Callable[[sqlite3.Connection], Any]) -> Any:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                out = work(self._db)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            return out

    def _query(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    # ---- files ---------------------------------------------------------------------------

    def add_file(self, f: FileRecord) -> None:
        self._tx(lambda db: _insert_file(db, f))

    def get_file(self, file_id: str, tenant: str | None = None) -> FileRecord | None:
        """The file, if it exists and (with `tenant`) belongs to that tenant."""
        rows = self._query(f"{_SELECT_FILE} WHERE id = ?", (file_id,))
        record = _file(rows[0]) if rows else None
        return record if record and (tenant is None or record.tenant == tenant) else None

    def list_files(self, tenant: str, purpose: str | None, after: str | None,
                   limit: int) -> list[FileRecord]:
        """Newest first; `after` is the id of the last file of the previous page."""
        sql, args = f"{_SELECT_FILE} WHERE tenant = ?", [tenant]
        if purpose is not None:
            sql, args = sql + " AND purpose = ?", [*args, purpose]
        if after is not None:
            sql, args = sql + " AND rowid < (SELECT rowid FROM files WHERE id = ?)", [*args, after]
        rows = self._query(sql + " ORDER BY rowid DESC LIMIT ?", [*args, limit])
        return [_file(r) for r in rows]

    def delete_file(self, file_id: str) -> None:
        self._tx(lambda db: db.execute("DELETE FROM files WHERE id = ?", (file_id,)))

    def file_ids(self) -> set[str]:
        return {r[0] for r in self._query("SELECT id FROM files")}

    # ---- batches -------------------------------------------------------------------------

    def add_batch(self, b: BatchRecord) -> None:
        row = _batch_row(b)
        sql = (f"INSERT INTO batches ({', '.join(_BATCH_COLUMNS)}) "
               f"VALUES ({', '.join('?' * len(row))})")
        self._tx(lambda db: db.execute(sql, row))

    def get_batch(self, batch_id: str, tenant: str | None = None) -> BatchRecord | None:
        rows = self._query(f"{_SELECT_BATCH} WHERE id = ?", (batch_id,))
        record = _batch(rows[0]) if rows else None
        return record if record and (tenant is None or record.tenant == tenant) else None

    def list_batches(self, tenant: str, after: str | None, limit: int) -> list[BatchRecord]:
        """Newest first; `after` is the id of the last batch of the previous page."""
        args: list[Any] = [tenant]
        sql = f"{_SELECT_BATCH} WHERE tenant = ?"
        if after is not None:
            sql += " AND seq < (SELECT seq FROM batches WHERE id = ?)"
            args.append(after)
        rows = self._query(sql + " ORDER BY seq DESC LIMIT ?", [*args, limit])
        return [_batch(r) for r in rows]

    def batches_in(self, statuses: Sequence[BatchStatus]) -> list[BatchRecord]:
        """Batches in any of `statuses`, oldest first."""
        marks = ", ".join("?" * len(statuses))
        rows = self._query(f"{_SELECT_BATCH} WHERE status IN ({marks}) ORDER BY seq",
                           [s.value for s in statuses])
        return [_batch(r) for r in rows]

    def recent_batches(self, limit: int) -> list[BatchRecord]:
        """Every batch still running, then the latest ended ones up to `limit` in all."""
        rows = self._query(f"{_SELECT_BATCH} ORDER BY completed_at IS NULL AND failed_at IS "
                           "NULL AND expired_at IS NULL AND cancelled_at IS NULL DESC, seq DESC "
                           "LIMIT ?", (limit,))
        return [_batch(r) for r in rows]

    def update_batch(self, batch_id: str, **fields: Any) -> None:
        """Set columns of one batch (statuses as BatchStatus, errors as a list)."""
        values = {k: _column_value(k, v) for k, v in fields.items()}
        sql = f"UPDATE batches SET {', '.join(f'{k} = ?' for k in values)} WHERE id = ?"
        self._tx(lambda db: db.execute(sql, [*values.values(), batch_id]))

    def cancel_batch(self, batch_id: str, now: int) -> bool:
        """validating/in_progress -> cancelling; False when the batch had moved on."""
        def work(db: sqlite3.Connection) -> bool:
            cur = db.execute("UPDATE batches SET status = ?, cancelling_at = ? WHERE id = ? AND "
                             "status IN (?, ?)", (BatchStatus.CANCELLING.value, now, batch_id,
                                                  BatchStatus.VALIDATING.value,
                                                  BatchStatus.IN_PROGRESS.value))
            return cur.rowcount == 1
        return bool(self._tx(work))

    # ---- lines ---------------------------------------------------------------------------

    def start_batch(self, batch_id: str, lines: Sequence[Line], now: int) -> bool:
        """validating -> in_progress with its lines stored; False when it is no longer
        validating (cancelled meanwhile)."""
        def work(db: sqlite3.Connection) -> bool:
            cur = db.execute("UPDATE batches SET status = ?, in_progress_at = ?, total = ? "
                             "WHERE id = ? AND status = ?",
                             (BatchStatus.IN_PROGRESS.value, now, len(lines), batch_id,
                              BatchStatus.VALIDATING.value))
            if cur.rowcount != 1:
                return False
            db.execute("DELETE FROM lines WHERE batch_id = ?", (batch_id,))
            db.executemany("INSERT INTO lines VALUES (?, ?, ?, ?, ?, NULL)",
                           [(batch_id, n, cid, body, LineState.PENDING.value)
                            for n, cid, body in lines])
            return True
        return bool(self._tx(work))

    def pending_lines(self, batch_id: str, after_line: int, limit: int) -> list[Line]:
        return [tuple(r) for r in self._query(
            "SELECT line_no, custom_id, body FROM lines WHERE batch_id = ? AND state = ? AND "
            "line_no > ? ORDER BY line_no LIMIT ?",
            (batch_id, LineState.PENDING.value, after_line, limit))]

    def count_pending(self, batch_id: str) -> int:
        rows = self._query("SELECT COUNT(*) FROM lines WHERE batch_id = ? AND state = ?",
                           (batch_id, LineState.PENDING.value))
        return int(rows[0][0])

    def record_line(self, batch_id: str, line_no: int, state: LineState,
                    result: dict[str, Any]) -> bool:
        """Answer a pending line once; False (and nothing written) if it was answered."""
        counter = "completed" if state is LineState.OUTPUT else "failed"

        def work(db: sqlite3.Connection) -> bool:
            cur = db.execute("UPDATE lines SET state = ?, result = ? WHERE batch_id = ? AND "
                             "line_no = ? AND state = ?",
                             (state.value, orjson.dumps(result).decode(), batch_id, line_no,
                              LineState.PENDING.value))
            if cur.rowcount != 1:
                return False
            db.execute(f"UPDATE batches SET {counter} = {counter} + 1 WHERE id = ?", (batch_id,))
            return True
        return bool(self._tx(work))

    def close_pending(self, batch_id: str,
                      result: Callable[[int, str], dict[str, Any]]) -> int:
        """Answer every pending line into the error file with `result(line_no, custom_id)`."""
        def work(db: sqlite3.Connection) -> int:
            rows = db.execute("SELECT line_no, custom_id FROM lines WHERE batch_id = ? AND "
                              "state = ?", (batch_id, LineState.PENDING.value)).fetchall()
            db.executemany("UPDATE lines SET state = ?, result = ? WHERE batch_id = ? AND "
                           "line_no = ?", [(LineState.ERROR.value,
                                            orjson.dumps(result(n, cid)).decode(), batch_id, n)
                                           for n, cid in rows])
            db.execute("UPDATE batches SET failed = failed + ? WHERE id = ?", (len(rows), batch_id))
            return len(rows)
        return int(self._tx(work))

    def results(self, batch_id: str) -> Iterator[tuple[LineState, str]]:
        """(state, result JSON) of every answered line, in input-line order."""
        last = 0
        while True:
            rows = self._query("SELECT line_no, state, result FROM lines WHERE batch_id = ? AND "
                               "line_no > ? AND state != ? ORDER BY line_no LIMIT 1000",
                               (batch_id, last, LineState.PENDING.value))
            for _, state, result in rows:
                yield LineState(state), result
            if len(rows) < 1000:
                return
            last = rows[-1][0]

    def finish_batch(self, batch_id: str, files: Sequence[FileRecord], **fields: Any) -> None:
        """Add the batch's result files and set its final fields in one transaction."""
        values = {k: _column_value(k, v) for k, v in fields.items()}
        sql = f"UPDATE batches SET {', '.join(f'{k} = ?' for k in values)} WHERE id = ?"

        def work(db: sqlite3.Connection) -> None:
            for f in files:
                _insert_file(db, f)
            db.execute(sql, [*values.values(), batch_id])
            db.execute("UPDATE lines SET body = NULL WHERE batch_id = ?", (batch_id,))
        self._tx(work)


def _insert_file(db: sqlite3.Connection, f: FileRecord) -> None:
    db.execute(f"INSERT INTO files ({', '.join(_FILE_COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
               (f.id, f.tenant, f.filename, f.purpose, f.bytes, f.created_at, f.num_lines,
                orjson.dumps(list(f.urls)).decode()))


def _column_value(key: str, value: Any) -> Any:
    if isinstance(value, BatchStatus):
        return value.value
    if key in ("errors", "metadata") and value is not None:
        return orjson.dumps(list(value) if key == "errors" else value).decode()
    return value


def _batch_row(b: BatchRecord) -> list[Any]:
    return [_column_value(k, getattr(b, k)) for k in _BATCH_COLUMNS]
