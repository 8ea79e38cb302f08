"""Uploads checked line by line; files written atomically; orphans cleaned."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from gateway.batches.files import FileStorage, UploadRejected, import_upload
from gateway.batches.lines import InputLine, LineError, parse_line, read_input
from tests.gateway.batches.helpers import COMPLETIONS, jsonl, line


def _check(raw: bytes) -> InputLine:
    return parse_line(raw)


def test_import_counts_lines_and_urls(tmp_path: Path) -> None:
    storage = FileStorage(tmp_path)
    data = jsonl([line(0), line(1, COMPLETIONS)]) + b"\n"
    got = import_upload(storage, "file-a", io.BytesIO(data), _check, 1 << 20, 10)
    assert (got.bytes, got.num_lines, got.urls) == (len(data), 2, {"/v1/chat/completions",
                                                                   COMPLETIONS})
    assert storage.path("file-a").read_bytes() == data
    lines, errors = read_input(storage.path("file-a"), COMPLETIONS)
    assert [n for n, _, _ in lines] == [2] and [e["line"] for e in errors] == [1]


def test_a_rejected_upload_leaves_nothing(tmp_path: Path) -> None:
    storage = FileStorage(tmp_path)
    bad = jsonl([line(i) for i in range(30)]).replace(b'"POST"', b'"GET"')
    with pytest.raises(UploadRejected) as info:
        import_upload(storage, "file-b", io.BytesIO(bad), _check, 1 << 20, 100)
    message = str(info.value)
    assert "30 of 30 requests are invalid" in message and "line 20:" in message
    assert "line 21:" not in message and "and 10 more" in message
    assert list(tmp_path.iterdir()) == []


def test_clean_removes_temporaries_and_unknown_files(tmp_path: Path) -> None:
    storage = FileStorage(tmp_path)
    storage.write("file-keep", lambda f: f.write(b"x"))
    storage.write("file-orphan", lambda f: f.write(b"y"))
    (tmp_path / "file-half.tmp").write_bytes(b"z")
    assert storage.clean({"file-keep"}) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["file-keep.jsonl"]
    with pytest.raises(ValueError):
        storage.path("../etc/passwd")


@pytest.mark.parametrize("raw, problem", [
    (b"[1]", "JSON object"), (b'{"custom_id": ""}', "custom_id"),
    (b'{"custom_id": "a", "method": "POST", "url": "/v1/completions"}', "'body'"),
])
def test_parse_line_names_the_field(raw: bytes, problem: str) -> None:
    with pytest.raises(LineError, match=problem):
        parse_line(raw)
