"""The access log: uvicorn's line for each HTTP request, written once its response is out.

uvicorn writes its access line (``uvicorn.access``, ``CLIENT - "METHOD PATH HTTP/V"
STATUS``) when the response starts, before the status line goes to the socket: on
every request's way to its client. This middleware writes the same line, through the
same logger and arguments (so uvicorn's formatter and any logging config still apply),
after the app has sent the whole response; the server's HTTP protocol
(`QuietHttpToolsProtocol`) writes none of its own.

NOTE: a streamed response is logged when it ends, not when it starts. A request that
got no response (the app raised before starting one) logs nothing here; the error
handlers' 500 is a response and is logged.
"""

from __future__ import annotations

import logging
from typing import Any, cast

from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

logger = logging.getLogger("uvicorn.access")


class AccessLogMiddleware:
    """Logs each HTTP request's status after its response has been sent."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not logger.isEnabledFor(logging.INFO):
            await self.app(scope, receive, send)
            return
        status: int | None = None

        async def send_noting_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_noting_status)
        finally:
            if status is not None:
                http = cast(Any, scope)  # NOTE: uvicorn's helpers take its own scope type
                logger.info('%s - "%s %s HTTP/%s" %d', get_client_addr(http), http["method"],
                            get_path_with_query_string(http), http["http_version"], status)


class QuietHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol without its access line (`AccessLogMiddleware` writes it).

    NOTE: not uvicorn's `access_log=False`, which takes the handlers off the
    ``uvicorn.access`` logger that the middleware writes through."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.access_log = False
