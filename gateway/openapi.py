"""The OpenAPI document served at `/openapi.json`: every endpoint, its body and its errors.

Routes parse their own bodies (gateway/protocol.py gives OpenAI-style 400s that
FastAPI's validation would not), so the document is written here rather than derived
from handler signatures. Every error answers with the OpenAI envelope (`Error`); 429
and 503 carry `Retry-After`. `tests/gateway/test_openapi.py` holds it to the routes and
runs schemathesis against a real server.
"""

from __future__ import annotations

import copy
from typing import Any

from gateway.openapi_schemas import SCHEMAS

JSON = "application/json"
_RETRY = {"Retry-After": {"description": "Seconds to wait before retrying (integer >= 1).",
                          "schema": {"type": "string", "pattern": "^[0-9]+$"}}}
_ERROR_TEXT = {
    400: "Invalid request (a field, the JSON, a prompt too long).",
    401: "Missing or unknown API key.",
    403: "The key may not do this (admin endpoints), or its tenant may not use the model.",
    404: "Unknown model, LoRA adapter, file, batch or page.",
    409: "The batch cannot be cancelled in its status; a tenant or key exists already; a "
         "LoRA adapter of that name is being unloaded.",
    413: "The request body is too large.",
    429: "A tenant quota (concurrency, requests or tokens per minute) is exhausted, or "
         "its token budget (insufficient_quota).",
    500: "Internal error; the server keeps serving.",
    503: "Shed: the server or the request's class is full, the request was evicted for "
         "higher-priority work, or the server is draining.",
}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _errors(*codes: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for code in codes:
        entry: dict[str, Any] = {"description": _ERROR_TEXT[code],
                                 "content": {JSON: {"schema": _ref("Error")}}}
        if code in (429, 503):
            entry["headers"] = _RETRY
        out[str(code)] = entry
    return out


def _ok(schema: dict[str, Any], media: str = JSON, description: str = "OK") -> dict[str, Any]:
    return {"200": {"description": description, "content": {media: {"schema": schema}}}}


_API_ERRORS = (400, 401, 413, 500, 503)  # what any /v1/ endpoint may answer
_GENERATION_ERRORS = (*_API_ERRORS, 403, 404, 429)
_ID = {"type": "string", "minLength": 1}
_TOKENIZER_ERRORS = (400, 401, 403, 404, 413, 500)  # /tokenize, /detokenize: no shedding


def _generation(summary: str, body: str, result: str) -> dict[str, Any]:
    responses = _ok(_ref(result), description="The result (JSON), or server-sent events "
                                              "with `stream: true`")
    responses["200"]["content"]["text/event-stream"] = {"schema": _ref("ServerSentEvent")}
    return {"post": {"summary": summary, "requestBody": {
        "required": True, "content": {JSON: {"schema": _ref(body)}}},
        "responses": {**responses, **_errors(*_GENERATION_ERRORS)}}}


def _get(summary: str, result: dict[str, Any], *codes: int, media: str = JSON,
         params: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary,
                          "responses": {**_ok(result, media), **_errors(*codes)}}
    if params:
        op["parameters"] = params
    return op


def _post(summary: str, body: str, result: str, *codes: int) -> dict[str, Any]:
    return {"post": {"summary": summary, "requestBody": {
        "required": True, "content": {JSON: {"schema": _ref(body)}}},
        "responses": {**_ok(_ref(result)), **_errors(*codes)}}}


def _lora(summary: str, body: str, *codes: int) -> dict[str, Any]:
    return {"post": {"summary": summary, "requestBody": {
        "required": True, "content": {JSON: {"schema": _ref(body)}}},
        "responses": {**_ok({"type": "string"}, "text/plain"),
                      **_errors(*codes, 401, 403, 413, 500, 503)}}}


def _path_param(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": _ID}


def _query(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema}


_ADMIN_ERRORS = (401, 403, 404, 500, 503)  # /admin/tenants: reads
_CHANGE_ERRORS = (400, 401, 403, 404, 409, 413, 500, 503)  # /admin/tenants: changes


def _change(summary: str, body: str | None, result: str, status: str = "200",
            params: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": {
        status: {"description": "Done", "content": {JSON: {"schema": _ref(result)}}},
        **_errors(*_CHANGE_ERRORS)}}
    if body is not None:
        op["requestBody"] = {"required": True, "content": {JSON: {"schema": _ref(body)}}}
    if params:
        op["parameters"] = params
    return op


def _tenant_paths() -> dict[str, Any]:
    """gateway/tenancy/admin.py's endpoints."""
    name = [_path_param("name")]
    return {
        "/admin/tenants": {
            "get": _get("List the running tenants", _ref("TenantList"), *_ADMIN_ERRORS),
            "post": _change("Add a tenant (a key is made when none is given)", "TenantCreate",
                            "Tenant", "201")},
        "/admin/tenants/reload": {"post": _change("Re-read the tenants file", None,
                                                  "TenantsReload")},
        "/admin/tenants/{name}": {
            "get": _get("A tenant", _ref("Tenant"), *_ADMIN_ERRORS, params=name),
            "patch": _change("Change a tenant's fields", "TenantUpdate", "Tenant",
                             params=name),
            "delete": _change("Remove a tenant, revoking its keys", None, "TenantDeleted",
                              params=name)},
        "/admin/tenants/{name}/keys": {"post": _change(
            "Add a key (made by the server when the body is {})", "TenantKeyCreate",
            "TenantKey", "201", params=name)},
        "/admin/tenants/{name}/keys/{key}": {"delete": _change(
            "Revoke a key", None, "TenantKeyDeleted", params=[*name, _path_param("key")])},
        "/admin/tenants/{name}/usage": {"get": _get(
            "Budget tokens spent and left this UTC day and month", _ref("TenantUsage"),
            *_ADMIN_ERRORS, params=name)},
        "/admin/audit": {"get": _get(
            "Changes of tenants and keys, newest first", _ref("AuditLog"), 400,
            *_ADMIN_ERRORS, params=[_query("limit", {"type": "integer"}),
                                    _query("before", {"type": "integer"}),
                                    _query("tenant", {"type": "string"})])},
    }


def _paths() -> dict[str, Any]:
    file_id, batch_id = [_path_param("file_id")], [_path_param("batch_id")]
    page = [_query("limit", {"type": "integer"}), _query("after", {"type": "string"})]
    return {
        "/v1/completions": _generation("Create a completion", "CompletionRequest",
                                       "Completion"),
        "/v1/chat/completions": _generation("Create a chat completion", "ChatCompletionRequest",
                                            "ChatCompletion"),
        "/v1/models": {"get": _get("List the served model and its LoRA adapters (those the "
                                   "key's tenant may use)", _ref("ModelList"), 401, 500, 503)},
        "/v1/load_lora_adapter": _lora("Load a LoRA adapter from a folder (vLLM's; admin)",
                                       "LoadLoraAdapter", 400, 409),
        "/v1/unload_lora_adapter": _lora("Unload a LoRA adapter; its requests in flight "
                                         "finish (vLLM's; admin)", "UnloadLoraAdapter", 400,
                                         404),
        "/health": {"get": {"summary": "Health: 200 while the scheduler, its executors and "
                                       "the Batch API run", "responses": {
            **_ok(_ref("Health")), "503": {"description": "Draining or unhealthy",
                                           "content": {JSON: {"schema": _ref("Health")}}}}}},
        "/openapi.json": {"get": _get("This document", {"type": "object"}, 500)},
        "/metrics": {"get": _get("Prometheus metrics", {"type": "string"}, 500,
                                 media="text/plain")},
        "/admin/gmg": {"get": _get("The Global Mapping Graph", {"type": "object"},
                                   401, 403, 500)},
        "/admin/timeline": {"get": _get("Op executions and finished requests since `since`",
                                        _ref("Timeline"), 400, 401, 403, 500,
                                        params=[_query("since", {"type": "number"})])},
        "/tokenize": _post("Token ids of a prompt or chat (vLLM's)", "TokenizeRequest",
                           "Tokenize", *_TOKENIZER_ERRORS),
        "/detokenize": _post("The text of token ids (vLLM's)", "DetokenizeRequest",
                             "Detokenize", *_TOKENIZER_ERRORS),
        "/version": {"get": _get("The server's version (vLLM's)", _ref("Version"), 500)},
        "/admin/direct": {"post": {
            "summary": "A completion's operator chain timed directly on a device",
            "parameters": [_query("device", {"type": "string"})],
            "requestBody": {"required": True,
                            "content": {JSON: {"schema": _ref("CompletionRequest")}}},
            "responses": {**_ok({"type": "object"}), **_errors(400, 401, 403, 404, 413, 500)}}},
        "/admin/ui": {"get": _get("The live admin page", {"type": "string"}, 500,
                                  media="text/html")},
        "/admin/ui/{name}": {"get": {"summary": "A static file of the admin page",
                                     "parameters": [_path_param("name")],
                                     "responses": {"200": {"description": "The file"},
                                                   **_errors(404, 500)}}},
        "/v1/files": {
            "post": {"summary": "Upload a JSONL batch input file", "requestBody": {
                "required": True, "content": {"multipart/form-data": {
                    "schema": _ref("FileUpload")}}},
                "responses": {**_ok(_ref("File")), **_errors(*_API_ERRORS)}},
            "get": _get("List files", _ref("FileList"), *_API_ERRORS,
                        params=[*page, _query("purpose", {"type": "string"})])},
        "/v1/files/{file_id}": {
            "get": _get("Retrieve a file", _ref("File"), *_API_ERRORS, 404, params=file_id),
            "delete": _get("Delete a file", _ref("FileDeleted"), *_API_ERRORS, 404,
                           params=file_id)},
        "/v1/files/{file_id}/content": {"get": _get(
            "A file's content", {"type": "string"}, *_API_ERRORS, 404,
            media="application/jsonl", params=file_id)},
        "/v1/batches": {
            "post": {"summary": "Create a batch", "requestBody": {
                "required": True, "content": {JSON: {"schema": _ref("BatchRequest")}}},
                "responses": {**_ok(_ref("Batch")), **_errors(*_API_ERRORS, 404)}},
            "get": _get("List batches", _ref("BatchList"), *_API_ERRORS, params=page)},
        "/v1/batches/{batch_id}": {"get": _get("Retrieve a batch", _ref("Batch"),
                                               *_API_ERRORS, 404, params=batch_id)},
        "/v1/batches/{batch_id}/cancel": {"post": {
            "summary": "Cancel a batch", "parameters": batch_id,
            "responses": {**_ok(_ref("Batch")), **_errors(*_API_ERRORS, 404, 409)}}},
        **_tenant_paths(),
    }


def document(version: str, models: tuple[str, ...] = ()) -> dict[str, Any]:
    """The OpenAPI 3.1 document of this server; `models`: the `model` values it serves."""
    schemas = copy.deepcopy(SCHEMAS)
    if models:
        for body in ("CompletionRequest", "ChatCompletionRequest"):
            schemas[body]["properties"]["model"] = {"anyOf": [{"enum": list(models)},
                                                              {"type": "null"}]}
    return {"openapi": "3.1.0",
            "info": {"title": "slicegate", "version": version,
                     "description": "OpenAI-compatible multi-tenant LLM gateway."},
            "components": {"schemas": schemas,
                           "securitySchemes": {"bearer": {"type": "http",
                                                          "scheme": "bearer"}}},
            "security": [{"bearer": []}, {}],
            "paths": _paths()}
