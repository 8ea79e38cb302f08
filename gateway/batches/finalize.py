"""A batch's end: its unanswered lines closed, its output and error files written.

Output and error files list result lines in input-line order. Their bytes
are written and renamed before the rows that name them are committed with
the terminal status, so a crash at any point leaves the batch `finalizing`
(or `cancelling`) and the next start writes the files again.
"""

from __future__ import annotations

from typing import BinaryIO

from gateway.batches.files import FileStorage, new_id
from gateway.batches.store import Store
from gateway.batches.types import (
    OUTPUT_PURPOSE,
    BatchRecord,
    BatchStatus,
    FileRecord,
    LineState,
    unanswered_line,
)

CLOSE_REASONS = {
    BatchStatus.CANCELLED: ("batch_cancelled", "The batch was cancelled before this request ran."),
    BatchStatus.EXPIRED: ("batch_expired", "This request could not be executed before the "
                                           "completion window expired."),
}
_AT = {BatchStatus.COMPLETED: "completed_at", BatchStatus.CANCELLED: "cancelled_at",
       BatchStatus.EXPIRED: "expired_at"}


def close_unanswered(store: Store, batch: BatchRecord, final: BatchStatus) -> int:
    """Answer the batch's pending lines with the error of `final` (cancelled or expired)."""
    code, message = CLOSE_REASONS[final]
    return store.close_pending(batch.id, lambda n, custom_id: unanswered_line(
        new_id("batch_req_"), custom_id, code, message))


def _write_results(store: Store, storage: FileStorage, batch: BatchRecord, state: LineState,
                   now: int) -> FileRecord | None:
    count = batch.completed if state is LineState.OUTPUT else batch.failed
    if count == 0:
        return None
    file_id = new_id("file-")

    def fill(out: BinaryIO) -> None:
        for line_state, result in store.results(batch.id):
            if line_state is state:
                out.write(result.encode() + b"\n")

    size = storage.write(file_id, fill)
    kind = "output" if state is LineState.OUTPUT else "error"
    return FileRecord(file_id, batch.tenant, f"batch_{batch.id}_{kind}.jsonl", OUTPUT_PURPOSE,
                      size, now, count, ())


def write_files(store: Store, storage: FileStorage, batch_id: str, final: BatchStatus,
                now: int) -> None:
    """Write the result files and commit the terminal status (blocking: run in a thread)."""
    batch = store.get_batch(batch_id)
    assert batch is not None
    output = _write_results(store, storage, batch, LineState.OUTPUT, now)
    errors = _write_results(store, storage, batch, LineState.ERROR, now)
    files = [f for f in (output, errors) if f is not None]
    store.finish_batch(batch_id, files, status=final, final_status=None,
                       output_file_id=output.id if output else None,
                       error_file_id=errors.id if errors else None, **{_AT[final]: now})
