"""Server-sent events: the stream body of a job and a response that races client disconnect.

A stream is `data: {chunk}` events, an optional usage chunk
(`stream_options.include_usage`) and `data: [DONE]`. When the client goes
away mid-stream the body is closed, which aborts every unfinished choice and
frees its KV blocks.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Mapping
from typing import Any

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gateway.errors import envelope, json_bytes
from gateway.generation import merge
from gateway.job import Job
from scheduler.ieg import SubmitError

logger = logging.getLogger("gateway")

DONE = b"data: [DONE]\n\n"


def sse(obj: Any) -> bytes:
    return b"data: " + json_bytes(obj) + b"\n\n"


async def wait_for_disconnect(receive: Receive) -> None:
    """Return once the client has gone away (or the response is complete)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def sse_body(job: Job, prompt_param: str) -> AsyncGenerator[bytes, None]:
    """The SSE events of a job; closing the generator aborts unfinished choices."""
    fmt = job.format
    deltas = merge(job.generations)
    try:
        if fmt.chat:
            for generation in job.generations:
                yield sse(fmt.role_chunk(generation.index))
        async for delta in deltas:
            if delta.finish_reason == "error":
                yield sse(envelope(f"Generation failed: {delta.error} (request id {fmt.id})",
                                   "server_error", code="generation_error"))
                break
            if delta.text or delta.finish_reason:
                yield sse(fmt.chunk(delta))
        else:
            if fmt.include_usage:
                yield sse(fmt.usage_chunk(job.usage()))
        yield DONE
    except SubmitError as exc:  # a scheduler that refuses lazily, at the first event
        yield sse(job.refused(exc, prompt_param).body())
        yield DONE
    except Exception:
        logger.exception("internal error in stream %s", fmt.id)
        yield sse(envelope(f"Internal server error (request id {fmt.id}).", "server_error",
                           code="internal_error"))
        yield DONE
    finally:
        await deltas.aclose()
        for generation in job.generations:  # the body may be closed before merge ever ran
            generation.close()
        job.finish()


class EventStreamResponse(Response):
    """An SSE response whose body races client disconnect and is always closed."""

    media_type = "text/event-stream"

    def __init__(self, body: AsyncGenerator[bytes, None],
                 headers: Mapping[str, str] | None = None) -> None:
        self.body_iterator = body
        self.status_code = 200
        self.background = None
        self.init_headers({"cache-control": "no-cache", "x-accel-buffering": "no",
                           **(headers or {})})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:

                async def stream() -> None:
                    await self._stream(send)
                    group.cancel_scope.cancel()

                async def watch() -> None:
                    await wait_for_disconnect(receive)
                    group.cancel_scope.cancel()

                group.start_soon(stream)
                group.start_soon(watch)
        finally:
            await self.body_iterator.aclose()

    async def _stream(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})
        try:
            async for chunk in self.body_iterator:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:  # ASGI 2.4 servers report a vanished client this way
            logger.info("client went away mid-stream")
