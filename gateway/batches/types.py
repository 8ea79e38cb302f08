"""Batch statuses and the OpenAI JSON shapes of files, batches and result lines."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

ENDPOINTS = ("/v1/chat/completions", "/v1/completions")
COMPLETION_WINDOWS = {"24h": 24 * 3600}
INPUT_PURPOSE = "batch"
OUTPUT_PURPOSE = "batch_output"


class BatchStatus(enum.Enum):
    """OpenAI's batch statuses; `validating` -> `in_progress` -> `finalizing` -> `completed`."""

    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL

    @property
    def can_cancel(self) -> bool:
        return self in (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS)


_TERMINAL = {BatchStatus.FAILED, BatchStatus.COMPLETED, BatchStatus.EXPIRED,
             BatchStatus.CANCELLED}


class LineState(enum.Enum):
    """Where one input line stands: not yet answered, or answered into one result file."""

    PENDING = "pending"
    OUTPUT = "output"  # its result line goes to the output file
    ERROR = "error"  # its result line goes to the error file


@dataclass(frozen=True, slots=True)
class FileRecord:
    """One stored file (an uploaded input or a batch's output/error file)."""

    id: str
    tenant: str
    filename: str
    purpose: str
    bytes: int
    created_at: int  # unix s
    num_lines: int
    urls: tuple[str, ...]  # the distinct `url`s of an input file's lines

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "object": "file", "bytes": self.bytes,
                "created_at": self.created_at, "expires_at": None, "filename": self.filename,
                "purpose": self.purpose, "status": "processed", "status_details": None}


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """One batch as stored; `to_json` is OpenAI's batch object."""

    id: str
    tenant: str
    input_file_id: str
    endpoint: str
    completion_window: str
    status: BatchStatus
    created_at: int  # unix s, like every *_at
    expires_at: int
    total: int = 0
    completed: int = 0
    failed: int = 0
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: tuple[dict[str, Any], ...] = ()  # validation errors: code, message, param, line
    metadata: dict[str, str] | None = None
    final_status: BatchStatus | None = None  # what `finalizing` ends in

    def to_json(self) -> dict[str, Any]:
        errors = {"object": "list", "data": list(self.errors)} if self.errors else None
        return {
            "id": self.id, "object": "batch", "endpoint": self.endpoint, "errors": errors,
            "input_file_id": self.input_file_id, "completion_window": self.completion_window,
            "status": self.status.value, "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id, "created_at": self.created_at,
            "in_progress_at": self.in_progress_at, "expires_at": self.expires_at,
            "finalizing_at": self.finalizing_at, "completed_at": self.completed_at,
            "failed_at": self.failed_at, "expired_at": self.expired_at,
            "cancelling_at": self.cancelling_at, "cancelled_at": self.cancelled_at,
            "request_counts": {"total": self.total, "completed": self.completed,
                               "failed": self.failed},
            "metadata": self.metadata,
        }


def result_line(line_id: str, custom_id: str, status_code: int, request_id: str,
                body: dict[str, Any]) -> dict[str, Any]:
    """A line that got an HTTP answer (200 into the output file, else the error file)."""
    return {"id": line_id, "custom_id": custom_id,
            "response": {"status_code": status_code, "request_id": request_id, "body": body},
            "error": None}


def unanswered_line(line_id: str, custom_id: str, code: str, message: str) -> dict[str, Any]:
    """A line that never ran (`batch_cancelled`, `batch_expired`): the error file."""
    return {"id": line_id, "custom_id": custom_id, "response": None,
            "error": {"code": code, "message": message}}
