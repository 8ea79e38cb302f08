"""The access log: one line for each HTTP request, written once its response is out.

uvicorn writes its access line (``uvicorn.access``, ``CLIENT - "METHOD PATH HTTP/V"
STATUS``) when the response starts, before the status line goes to the socket: on
every request's way to its client. This middleware writes the same line, through the
same logger, after the app has sent the whole response; the server's HTTP protocol
(`QuietHttpToolsProtocol`) writes none of its own.

A 4xx or 5xx is that same one line, at WARNING (4xx) or ERROR (5xx), with what the
client was told (the error envelope's code or type and message), the tenant and the
request id (noted while the request ran, `gateway.logs.note_request`), and, for an
exception that became a 500, its traceback: no second line says the same thing.

NOTE: a streamed response is logged when it ends, not when it starts. A request that
got no response (the app raised before starting one) logs nothing here; the error
handlers' 500 is a response and is logged.
"""

from __future__ import annotations

import logging
from typing import Any, cast

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

from gateway.logs import ERROR_FIELD, begin_request, end_request

logger = logging.getLogger("uvicorn.access")

REASON_BYTES = 4096  # of an error response's body kept for its reason
REASON_CHARS = 500  # of a reason that is not the error envelope, in the line


class AccessLogMiddleware:
    """Logs each HTTP request's status after its response has been sent (see the module
    docstring); an error's line carries its reason, tenant and request id."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status: int | None = None
        body = bytearray()  # the first bytes of an error response: its reason

        async def send_noting_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            elif status is not None and status >= 400 and len(body) < REASON_BYTES:
                body.extend(message.get("body", b"")[:REASON_BYTES - len(body)])
            await send(message)

        fields, token = begin_request()
        try:
            await self.app(scope, receive, send_noting_status)
        finally:
            end_request(token)
            if status is not None:
                log_access(cast(Any, scope), status, bytes(body), fields)


def log_access(scope: Any, status: int, body: bytes, fields: dict[str, Any]) -> None:
    """The one line of a request that got `status` (and, for an error, `body`)."""
    error = fields.pop(ERROR_FIELD, None)
    level = (logging.ERROR if status >= 500 or error is not None
             else logging.WARNING if status >= 400 else logging.INFO)
    if not logger.isEnabledFor(level):
        return
    # NOTE: uvicorn's helpers take its own scope type
    line = (f'{get_client_addr(scope)} - "{scope["method"]} '
            f'{get_path_with_query_string(scope)} HTTP/{scope["http_version"]}" {status}')
    extra: dict[str, Any] = {**fields, "status": status, "method": scope["method"],
                             "path": scope["path"]}
    if status >= 400:
        code, reason = error_reason(body)
        extra.update(error_code=code, reason=reason)
        line += f" {code}: {reason}"
    elif error is not None:
        line += " cut short by an internal error"
    noted = [f"{key}={fields[key]}" for key in ("tenant", "request_id") if key in fields]
    if level > logging.INFO and noted:
        line += f" [{' '.join(noted)}]"
    exc_info = (type(error), error, error.__traceback__) if error is not None else None
    logger.log(level, "%s", one_line(line), extra=extra, exc_info=exc_info)


def one_line(text: str) -> str:
    """`text` with its line breaks escaped: a client's path or input cannot forge a line."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


def error_reason(body: bytes) -> tuple[str, str]:
    """(code or type, message) of an OpenAI error envelope, else ("error", the body's text)."""
    try:
        error = orjson.loads(body)["error"]
        code = str(error.get("code") or error.get("type") or "error")
        return code, str(error["message"])
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        text = body.decode("utf-8", "replace").strip() or "(no response body)"
        return "error", (text[:REASON_CHARS] + "...") if len(text) > REASON_CHARS else text


class QuietHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol without its access line (`AccessLogMiddleware` writes it).

    NOTE: not uvicorn's `access_log=False`, which takes the handlers off the
    ``uvicorn.access`` logger that the middleware writes through."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.access_log = False
