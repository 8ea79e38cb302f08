"""File bytes on disk under `<data dir>/files/`, and the checked import of an upload.

A file is written to a temporary name, flushed and renamed, and only then
recorded in the database, so a crash leaves at worst a file without a row,
which `clean` removes at the next start.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from gateway.batches.lines import InputLine, LineError

MAX_REPORTED_ERRORS = 20  # line errors listed in one 400


class UploadRejected(ValueError):
    """An upload that is not a valid batch input file; the message lists the bad lines."""


def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


class FileStorage:
    """The folder of stored files, one `<id>.jsonl` each."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def path(self, file_id: str) -> Path:
        if not file_id.replace("-", "").isalnum():
            raise ValueError(f"bad file id {file_id!r}")
        return self.root / f"{file_id}.jsonl"

    def write(self, file_id: str, fill: Callable[[BinaryIO], None]) -> int:
        """Create the file with `fill(stream)`, atomically; its size in bytes."""
        target = self.path(file_id)
        tmp = target.with_suffix(".tmp")
        try:
            with open(tmp, "wb") as out:
                fill(out)
                out.flush()
                os.fsync(out.fileno())
            tmp.rename(target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return target.stat().st_size

    def remove(self, file_id: str) -> None:
        self.path(file_id).unlink(missing_ok=True)

    def clean(self, known: set[str]) -> int:
        """Remove temporaries and files with no database row; how many were removed."""
        removed = 0
        for entry in self.root.iterdir():
            if entry.suffix == ".tmp" or (entry.suffix == ".jsonl" and entry.stem not in known):
                entry.unlink(missing_ok=True)
                removed += 1
        return removed


def numbered_lines(stream: BinaryIO) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, line) of every non-blank line."""
    for number, raw in enumerate(stream, start=1):
        line = raw.strip()
        if line:
            yield number, line


@dataclass(slots=True)
class ImportedFile:
    """What an accepted upload holds."""

    bytes: int = 0
    num_lines: int = 0  # requests (non-blank lines)
    urls: set[str] = field(default_factory=set)


@dataclass(slots=True)
class _Checker:
    check: Callable[[bytes], InputLine]
    max_bytes: int
    max_lines: int
    out: ImportedFile = field(default_factory=ImportedFile)
    errors: list[str] = field(default_factory=list)
    num_bad: int = 0
    seen: dict[str, int] = field(default_factory=dict)  # custom_id -> line number

    def feed(self, number: int, raw: bytes) -> None:
        self.out.bytes += len(raw)
        if self.out.bytes > self.max_bytes:
            raise UploadRejected(f"The file is larger than this server's limit of "
                                 f"{self.max_bytes} bytes.")
        line = raw.strip()
        if not line:
            return
        self.out.num_lines += 1
        if self.out.num_lines > self.max_lines:
            raise UploadRejected(f"The file has more than this server's limit of "
                                 f"{self.max_lines} requests.")
        try:
            parsed = self.check(line)
        except LineError as exc:
            self._bad(number, str(exc))
            return
        first = self.seen.setdefault(parsed.custom_id, number)
        if first != number:
            self._bad(number, f"custom_id {parsed.custom_id!r} is already used on line {first}")
        self.out.urls.add(parsed.url)

    def _bad(self, number: int, problem: str) -> None:
        self.num_bad += 1
        if len(self.errors) < MAX_REPORTED_ERRORS:
            self.errors.append(f"line {number}: {problem}")

    def verdict(self) -> None:
        if self.num_bad:
            more = self.num_bad - len(self.errors)
            listed = "; ".join(self.errors) + (f"; and {more} more" if more > 0 else "")
            raise UploadRejected(f"The file is not a valid batch input file: {self.num_bad} of "
                                 f"{self.out.num_lines} requests are invalid: {listed}.")
        if not self.out.num_lines:
            raise UploadRejected("The file holds no requests: expected one JSON object per line "
                                 "with custom_id, method, url and body.")


def import_upload(storage: FileStorage, file_id: str, source: BinaryIO,
                  check: Callable[[bytes], InputLine], max_bytes: int,
                  max_lines: int) -> ImportedFile:
    """Copy an upload into storage as `file_id`, checking every line with `check`.

    Raises UploadRejected (nothing is stored) naming up to 20 bad lines by number.
    """
    checker = _Checker(check, max_bytes, max_lines)

    def fill(out: BinaryIO) -> None:
        for number, raw in enumerate(source, start=1):
            checker.feed(number, raw)
            out.write(raw)
        checker.verdict()

    storage.write(file_id, fill)
    return checker.out
