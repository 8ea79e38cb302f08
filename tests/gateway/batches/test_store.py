"""The SQLite store: exactly-once line results, ordering, paging, reopening."""

from __future__ import annotations

from pathlib import Path

from gateway.batches.store import Store
from gateway.batches.types import BatchRecord, BatchStatus, FileRecord, LineState


def _batch(batch_id: str, tenant: str = "t") -> BatchRecord:
    return BatchRecord(batch_id, tenant, "file-1", "/v1/completions", "24h",
                       BatchStatus.VALIDATING, 100, 200)


def test_a_line_is_answered_once_and_results_come_in_line_order(tmp_path: Path) -> None:
    store = Store(tmp_path / "db")
    store.add_batch(_batch("b1"))
    assert store.start_batch("b1", [(n, f"c{n}", "{}") for n in (7, 2, 5)], now=101)
    assert not store.start_batch("b1", [], now=102)  # no longer validating
    assert [n for n, _, _ in store.pending_lines("b1", 0, 10)] == [2, 5, 7]
    assert store.record_line("b1", 5, LineState.OUTPUT, {"n": 5})
    assert not store.record_line("b1", 5, LineState.ERROR, {"n": "again"})
    assert store.record_line("b1", 7, LineState.ERROR, {"n": 7})
    assert store.close_pending("b1", lambda n, cid: {"closed": cid}) == 1
    assert store.count_pending("b1") == 0
    assert list(store.results("b1")) == [(LineState.ERROR, '{"closed":"c2"}'),
                                         (LineState.OUTPUT, '{"n":5}'),
                                         (LineState.ERROR, '{"n":7}')]
    b = store.get_batch("b1")
    assert b is not None and (b.status, b.total, b.completed, b.failed) == (
        BatchStatus.IN_PROGRESS, 3, 1, 2)
    store.close()
    reopened = Store(tmp_path / "db")
    again = reopened.get_batch("b1")
    assert again is not None and again.completed == 1 and again.in_progress_at == 101


def test_ownership_paging_cancel_and_finish(tmp_path: Path) -> None:
    store = Store(tmp_path / "db")
    for i in range(3):
        store.add_batch(_batch(f"b{i}"))
    store.add_batch(_batch("other", tenant="u"))
    assert store.get_batch("other", "t") is None and store.get_batch("other", "u") is not None
    assert [b.id for b in store.list_batches("t", None, 2)] == ["b2", "b1"]
    assert [b.id for b in store.list_batches("t", "b1", 2)] == ["b0"]
    assert store.cancel_batch("b0", now=150)
    assert not store.cancel_batch("b0", now=151)
    out = FileRecord("file-out", "t", "out.jsonl", "batch_output", 10, 160, 1, ())
    store.finish_batch("b1", [out], status=BatchStatus.COMPLETED, completed_at=160,
                       output_file_id="file-out")
    done = store.get_batch("b1")
    assert done is not None and done.status.is_terminal and done.output_file_id == "file-out"
    assert store.get_file("file-out", "t") == out and store.get_file("file-out", "u") is None
    assert [b.id for b in store.batches_in([BatchStatus.CANCELLING])] == ["b0"]
    assert store.recent_batches(10)[-1].id == "b1"  # ended batches come after running ones
