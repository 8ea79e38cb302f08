"""The Batch API's state for one app: the data dir (locked), its store and files, the feeder.

`start` runs in the app's lifespan: it takes an exclusive lock on the data
dir (a second server on the same dir refuses to start), opens the database,
removes files a crash left without a row, and starts the feeder, which
resumes every unfinished batch. `stop` aborts lines in flight; they stay
pending and run again at the next start.
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily, Metric

from gateway.batches.context import BatchContext
from gateway.batches.feeder import Feeder
from gateway.batches.files import FileStorage
from gateway.batches.store import Store
from gateway.config import BatchSettings
from gateway.errors import ApiError

logger = logging.getLogger("gateway.batches")

DB_NAME = "slicegate.db"
PROGRESS_BATCHES = 20  # batches /metrics reports progress of (unfinished first)


class DataDirBusy(RuntimeError):
    """Another process holds the data dir."""


def lock_data_dir(data_dir: Path) -> int:
    """An open descriptor holding an exclusive lock on `data_dir` (released when closed)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(data_dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DataDirBusy(f"another slicegate server uses the data dir {data_dir}; stop it "
                          "or pass a different --data-dir") from None
    return fd


def check_data_dir(data_dir: str) -> None:
    """Raise DataDirBusy (or OSError) now if `data_dir` cannot be locked; holds nothing."""
    os.close(lock_data_dir(Path(data_dir).expanduser()))


class BatchService:
    """Store, file storage and feeder of one app (`app.state.gateway.batches`)."""

    def __init__(self, settings: BatchSettings) -> None:
        self.settings = settings
        self.data_dir = Path(settings.resolved_data_dir).expanduser()
        self._lock_fd: int | None = None
        self._store: Store | None = None
        self._storage: FileStorage | None = None
        self._feeder: Feeder | None = None

    async def start(self, context: BatchContext) -> None:
        self._lock_fd = lock_data_dir(self.data_dir)
        self._store = Store(self.data_dir / DB_NAME)
        self._storage = FileStorage(self.data_dir / "files")
        removed = self._storage.clean(self._store.file_ids())
        if removed:
            logger.warning("removed %d file(s) left without a database row by a crash", removed)
        self._feeder = Feeder(context, self._store, self._storage, self.settings)
        self._feeder.start()

    async def stop(self) -> None:
        if self._feeder is not None:
            await self._feeder.stop()
        if self._store is not None:
            self._store.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
        self._feeder = self._store = self._storage = None
        self._lock_fd = None

    @property
    def store(self) -> Store:
        if self._store is None:
            raise ApiError(503, "The Batch API is not running.", code="unavailable")
        return self._store

    @property
    def storage(self) -> FileStorage:
        if self._storage is None:
            raise ApiError(503, "The Batch API is not running.", code="unavailable")
        return self._storage

    def wake(self) -> None:
        if self._feeder is not None:
            self._feeder.wake()

    @property
    def problem(self) -> str | None:
        """Why batches cannot run now (for /health), or None."""
        if self._feeder is None:
            return None
        if self._feeder.dead:
            return f"the batch feeder stopped: {self._feeder.error}"
        if self._feeder.error is not None:
            return f"the batch feeder is failing: {self._feeder.error}"
        return None

    def collect(self) -> Iterator[Metric]:
        """Batch progress and feeder state for /metrics."""
        progress = GaugeMetricFamily("slicegate_batch_requests",
                                     "Requests of recent batches by state (total, completed, "
                                     "failed).", labels=["batch", "tenant", "status", "state"])
        feeder = GaugeMetricFamily("slicegate_batch_lines", "Batch lines submitted and "
                                   "unfinished (in_flight), of which without a first token "
                                   "(waiting).", labels=["state"])
        if self._store is not None and self._feeder is not None:
            for b in self._store.recent_batches(PROGRESS_BATCHES):
                for name, value in (("total", b.total), ("completed", b.completed),
                                    ("failed", b.failed)):
                    progress.add_metric([b.id, b.tenant, b.status.value, name], value)
            feeder.add_metric(["in_flight"], self._feeder.num_in_flight)
            feeder.add_metric(["waiting"], self._feeder.num_waiting)
        yield progress
        yield feeder
