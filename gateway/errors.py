"""Errors in the OpenAI envelope, and the handlers that make every failure answer with it.

Every error the gateway returns is `{"error": {"message", "type", "param", "code"}}`.
`ApiError` carries one; the exception handlers turn FastAPI's and Starlette's own
errors (422 validation, 404 route, 405 method) into it, and `ErrorMiddleware`
turns any unexpected exception into a 500 that names the request id, so the
server keeps serving.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Mapping
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.logs import note_error, note_request

logger = logging.getLogger("gateway")

ECHO_LIMIT_CHARS = 200  # at most this much client input is echoed back in a message

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable",
}


class ApiError(Exception):
    """An error answered with the OpenAI envelope and HTTP `status`."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, type: str | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(status, "server_error")
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return envelope(self.message, self.type, self.param, self.code)


def envelope(message: str, type: str, param: str | None = None,
             code: str | None = None) -> dict[str, Any]:
    """The OpenAI error object."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def clip(value: Any, limit: int = ECHO_LIMIT_CHARS) -> str:
    """`repr(value)`, cut to `limit` characters, for echoing client input in a message."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "...(truncated)"


def invalid(param: str | None, message: str, code: str | None = None) -> ApiError:
    """A 400 about one request parameter."""
    return ApiError(400, message, param=param, code=code)


def unsupported(param: str, detail: str = "") -> ApiError:
    """A 400 naming a parameter this server does not implement."""
    message = f"Unsupported parameter: '{param}' is not supported by this server"
    return ApiError(400, message + (f" ({detail})." if detail else "."), param=param,
                    code="unsupported_parameter")


def json_bytes(content: Any) -> bytes:
    return orjson.dumps(content, option=orjson.OPT_NON_STR_KEYS)


def error_response(error: ApiError) -> Response:
    return Response(json_bytes(error.body()), status_code=error.status,
                    headers=error.headers, media_type="application/json")


def request_id_of(request: Request) -> str:
    """The id `ErrorMiddleware` gave this HTTP request."""
    return str(request.scope.get("state", {}).get("request_id", "unknown"))


def arrival_of(request: Request) -> float:
    """Monotonic time the HTTP request arrived (set by `ErrorMiddleware`)."""
    return float(request.scope.get("state", {}).get("arrival_time", time.monotonic()))


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = "not_found" if exc.status_code == 404 else None
    return error_response(ApiError(exc.status_code, str(exc.detail), code=code,
                                   headers=exc.headers))


async def _validation_error(request: Request, exc: Exception) -> Response:
    # NOTE: routes parse their own bodies; this only guards against FastAPI's 422 leaking out.
    return error_response(invalid(None, f"Invalid request: {clip(str(exc))}"))


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_middleware(ErrorMiddleware)


class ErrorMiddleware:
    """Gives each HTTP request an id (`X-Request-Id`) and turns escaped exceptions into 500s."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = secrets.token_hex(12)
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        in_access_log = note_request(request_id=request_id)
        state.setdefault("arrival_time", time.monotonic())
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message["headers"] = [*message.get("headers", []),
                                      (b"x-request-id", request_id.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception as exc:
            if not in_access_log:  # NOTE: else its access line carries the traceback
                logger.exception("internal error in request %s", request_id)
            note_error(exc)
            if started:
                return  # the status line is out; the client sees a truncated body
            error = ApiError(500, f"Internal server error (request id {request_id}); "
                                  "the server keeps serving.", code="internal_error")
            await error_response(error)(scope, receive, send_with_id)
