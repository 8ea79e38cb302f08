"""The Batch API endpoints: /v1/files and /v1/batches, each object visible to its tenant only.

A file or batch of another tenant answers 404 exactly as one that does not
exist, so ids leak nothing.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter, Request
from starlette.datastructures import UploadFile
from starlette.responses import FileResponse, Response

from gateway.batches.files import UploadRejected, import_upload, new_id
from gateway.batches.lines import check_line
from gateway.batches.service import BatchService
from gateway.batches.types import (
    COMPLETION_WINDOWS,
    ENDPOINTS,
    INPUT_PURPOSE,
    BatchRecord,
    BatchStatus,
    FileRecord,
)
from gateway.errors import ApiError, clip, invalid
from gateway.fields import Fields, type_error
from gateway.protocol import parse_json
from gateway.responses import json_response
from gateway.state import AppState, state_of
from gateway.tenants import Tenant, authenticate

router = APIRouter()

MAX_FILENAME_CHARS = 255
MAX_METADATA_PAIRS = 16


def _context(request: Request) -> tuple[AppState, BatchService, Tenant]:
    state = state_of(request)
    tenant = authenticate(state.tenants.current, request.headers.get("authorization"))
    return state, state.batches, tenant


def _not_found(kind: str, object_id: str) -> ApiError:
    return ApiError(404, f"No such {kind} object: {clip(object_id)}.", param="id",
                    code="not_found", type="invalid_request_error")


def _own_file(batches: BatchService, tenant: Tenant, file_id: str) -> FileRecord:
    record = batches.store.get_file(file_id, tenant.name)
    if record is None:
        raise _not_found("File", file_id)
    return record


def _own_batch(batches: BatchService, tenant: Tenant, batch_id: str) -> BatchRecord:
    record = batches.store.get_batch(batch_id, tenant.name)
    if record is None:
        raise _not_found("Batch", batch_id)
    return record


def _limit(request: Request, default: int, maximum: int) -> int:
    raw = request.query_params.get("limit")
    if raw is None:
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= maximum:
        raise invalid("limit", f"'limit' must be an integer in [1, {maximum}], got {clip(raw)}.")
    return int(raw)


def _page(items: list[Any], limit: int) -> dict[str, Any]:
    data = [item.to_json() for item in items[:limit]]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": len(items) > limit}


# ---- files ---------------------------------------------------------------------------------


@router.post("/v1/files")
async def create_file(request: Request) -> Response:
    state, batches, tenant = _context(request)
    async with request.form(max_files=1, max_fields=8) as form:
        purpose, upload = form.get("purpose"), form.get("file")
        if not isinstance(purpose, str):
            raise invalid("purpose", "'purpose' is required.", code="missing_required_parameter")
        if purpose != INPUT_PURPOSE:
            raise invalid("purpose", f"Only purpose 'batch' is supported, got {clip(purpose)}.")
        if not isinstance(upload, UploadFile):
            raise invalid("file", "'file' is required: a JSONL file sent as multipart form "
                                  "data.", code="missing_required_parameter")
        record = await _import(state, batches, tenant, upload)
    return json_response(record.to_json())


async def _import(state: AppState, batches: BatchService, tenant: Tenant,
                  upload: UploadFile) -> FileRecord:
    file_id = new_id("file-")
    engine, server = state.engine, state.config.server
    try:
        imported = await asyncio.to_thread(
            import_upload, batches.storage, file_id, upload.file,
            lambda raw: check_line(raw, engine, server.max_prompts_per_request),
            batches.settings.max_file_bytes, batches.settings.max_file_lines)
    except UploadRejected as exc:
        raise invalid("file", str(exc), code="invalid_batch_input") from None
    filename = (upload.filename or "input.jsonl")[:MAX_FILENAME_CHARS]
    record = FileRecord(file_id, tenant.name, filename, INPUT_PURPOSE, imported.bytes,
                        int(time.time()), imported.num_lines, tuple(sorted(imported.urls)))
    try:
        batches.store.add_file(record)
    except BaseException:
        batches.storage.remove(file_id)
        raise
    return record


@router.get("/v1/files")
async def list_files(request: Request) -> Response:
    _, batches, tenant = _context(request)
    limit = _limit(request, 10_000, 10_000)
    purpose = request.query_params.get("purpose")
    files = batches.store.list_files(tenant.name, purpose, request.query_params.get("after"),
                                     limit + 1)
    return json_response(_page(files, limit))


@router.get("/v1/files/{file_id}")
async def retrieve_file(request: Request, file_id: str) -> Response:
    _, batches, tenant = _context(request)
    return json_response(_own_file(batches, tenant, file_id).to_json())


@router.get("/v1/files/{file_id}/content")
async def file_content(request: Request, file_id: str) -> Response:
    _, batches, tenant = _context(request)
    record = _own_file(batches, tenant, file_id)
    path = batches.storage.path(record.id)
    if not path.is_file():
        raise ApiError(500, f"The content of file {record.id} is missing on disk.",
                       code="file_missing")
    return FileResponse(path, media_type="application/jsonl", filename=record.filename)


@router.delete("/v1/files/{file_id}")
async def delete_file(request: Request, file_id: str) -> Response:
    _, batches, tenant = _context(request)
    record = _own_file(batches, tenant, file_id)
    batches.store.delete_file(record.id)
    batches.storage.remove(record.id)
    return json_response({"id": record.id, "object": "file", "deleted": True})


# ---- batches -------------------------------------------------------------------------------


def _metadata(fields: Fields) -> dict[str, str] | None:
    value = fields.raw("metadata")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise type_error("metadata", "an object of strings", value)
    if len(value) > MAX_METADATA_PAIRS:
        raise invalid("metadata", f"'metadata' may hold at most {MAX_METADATA_PAIRS} pairs.")
    for key, item in value.items():
        if len(key) > 64 or not isinstance(item, str) or len(item) > 512:
            raise invalid(f"metadata.{clip(key, 64)}", "'metadata' keys are strings of at most "
                          "64 characters and values strings of at most 512.")
    return dict(value)


@router.post("/v1/batches")
async def create_batch(request: Request) -> Response:
    _, batches, tenant = _context(request)
    fields = Fields(parse_json(await request.body()))
    input_file_id = fields.str_("input_file_id")
    if not input_file_id:
        raise invalid("input_file_id", "'input_file_id' is required.",
                      code="missing_required_parameter")
    endpoint = fields.str_("endpoint", choices=ENDPOINTS)
    if endpoint is None:
        raise invalid("endpoint", "'endpoint' is required.", code="missing_required_parameter")
    window = fields.str_("completion_window", choices=tuple(COMPLETION_WINDOWS))
    if window is None:
        raise invalid("completion_window", "'completion_window' is required.",
                      code="missing_required_parameter")
    metadata = _metadata(fields)
    source = _own_file(batches, tenant, input_file_id)
    if source.purpose != INPUT_PURPOSE:
        raise invalid("input_file_id", f"File {source.id} has purpose {source.purpose!r}, not "
                                       "'batch'.")
    now = int(time.time())
    record = BatchRecord(new_id("batch_"), tenant.name, source.id, endpoint, window,
                         BatchStatus.VALIDATING, now, now + COMPLETION_WINDOWS[window],
                         total=source.num_lines, metadata=metadata)
    batches.store.add_batch(record)
    batches.wake()
    return json_response(record.to_json())


@router.get("/v1/batches")
async def list_batches(request: Request) -> Response:
    _, batches, tenant = _context(request)
    limit = _limit(request, 20, 100)
    found = batches.store.list_batches(tenant.name, request.query_params.get("after"), limit + 1)
    return json_response(_page(found, limit))


@router.get("/v1/batches/{batch_id}")
async def retrieve_batch(request: Request, batch_id: str) -> Response:
    _, batches, tenant = _context(request)
    return json_response(_own_batch(batches, tenant, batch_id).to_json())


@router.post("/v1/batches/{batch_id}/cancel")
async def cancel_batch(request: Request, batch_id: str) -> Response:
    _, batches, tenant = _context(request)
    record = _own_batch(batches, tenant, batch_id)
    if not batches.store.cancel_batch(record.id, int(time.time())):
        current = batches.store.get_batch(record.id)
        status = current.status.value if current else record.status.value
        if status not in (BatchStatus.CANCELLING.value, BatchStatus.CANCELLED.value):
            raise ApiError(409, f"Cannot cancel a batch with status {status!r}.",
                           code="batch_not_cancellable", type="invalid_request_error")
    batches.wake()
    return json_response(_own_batch(batches, tenant, batch_id).to_json())

