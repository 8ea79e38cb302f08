"""A cap on request bodies: 413 with the OpenAI error envelope, without reading past the cap.

A declared `Content-Length` over the cap is refused before any of the body is
read; a chunked body is counted as it arrives and refused once it passes the
cap, so a client cannot make the server buffer more than `max_bytes`.
"""

from __future__ import annotations

from collections.abc import Mapping

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import ApiError, error_response


def too_large(max_bytes: int) -> ApiError:
    return ApiError(413, f"The request body is larger than this server's limit of "
                         f"{max_bytes} bytes.", code="request_too_large",
                    type="invalid_request_error", headers={"connection": "close"})


class BodyLimitMiddleware:
    """Caps bodies at `max_bytes`, or at `path_limits[path]` for those paths (uploads)."""

    def __init__(self, app: ASGIApp, max_bytes: int,
                 path_limits: Mapping[str, int] | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.path_limits = dict(path_limits or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.path_limits.get(str(scope.get("path", "")), self.max_bytes)
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await error_response(too_large(limit))(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise too_large(limit)  # answered by the ApiError handler
            return message

        await self.app(scope, counted, send)
