"""Server-sent events: the stream body of a job and a response that races client disconnect.

A stream is `data: {chunk}` events, an optional usage chunk
(`stream_options.include_usage`) and `data: [DONE]`. When the client goes
away mid-stream the body is closed, which aborts every unfinished choice and
frees its KV blocks.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gateway.disconnect import unless_disconnected
from gateway.errors import envelope, json_bytes
from gateway.generation import Delta, merge
from gateway.job import Job
from gateway.responses import ResponseFormat
from gateway.tools.output import ChoiceDeltas
from scheduler.api import SubmitError

logger = logging.getLogger("gateway")

DONE = b"data: [DONE]\n\n"


def sse(obj: Any) -> bytes:
    return b"data: " + json_bytes(obj) + b"\n\n"


async def first_delta(job: Job, receive: Receive, prompt_param: str
                      ) -> tuple[AsyncGenerator[Delta, None], Delta] | None:
    """The job's deltas and the first of them, awaited before the response starts, so that a
    request shed while it waits (evicted for a higher class) still gets its 503 with
    Retry-After (raised as an ApiError). None when the client went away first.

    NOTE: the 200 and the first token now leave together; before, the headers went out at
    once and a refusal could only be an error event inside the stream."""
    deltas = merge(job.generations)
    started = False
    try:
        done, first = await unless_disconnected(anext(deltas), receive)
        if not done or first is None:
            return None
        started = True
        return deltas, first
    except SubmitError as exc:
        raise job.refused(exc, prompt_param) from None
    finally:
        if not started:
            await _close(job, deltas)


async def _close(job: Job, deltas: AsyncGenerator[Delta, None]) -> None:
    await deltas.aclose()
    for generation in job.generations:
        generation.close()
    job.finish()


async def _chain(first: Delta | None, rest: AsyncGenerator[Delta, None]
                 ) -> AsyncGenerator[Delta, None]:
    if first is not None:
        yield first
    async for delta in rest:
        yield delta


async def sse_body(job: Job, prompt_param: str,
                   started: tuple[AsyncGenerator[Delta, None], Delta] | None = None
                   ) -> AsyncGenerator[bytes, None]:
    """The SSE events of a job (after `started`, what `first_delta` awaited, if given);
    closing the generator aborts unfinished choices."""
    fmt = job.format
    deltas = started[0] if started else merge(job.generations)
    # NOTE: the last choice's last chunk, the usage chunk and [DONE] leave in one write
    # (with the response's end, `EventStreamResponse`): ~0.1-0.2 ms a write saved
    tail, unfinished = b"", len(job.generations)
    events = _events(fmt)
    try:
        if fmt.chat:
            for generation in job.generations:
                yield sse(fmt.role_chunk(generation.index))
        async for delta in _chain(started[1] if started else None, deltas):
            if delta.finish_reason == "error":
                yield sse(envelope(f"Generation failed: {delta.error} (request id {fmt.id})",
                                   "server_error", code="generation_error"))
                break
            if not (delta.text or delta.finish_reason or delta.logprobs):
                continue
            unfinished -= delta.finish_reason is not None
            if unfinished:
                if body := events(delta):
                    yield body
            else:
                tail = events(delta)
        else:
            if fmt.include_usage:
                tail += sse(fmt.usage_chunk(job.usage()))
        yield tail + DONE
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


def _events(fmt: ResponseFormat) -> Callable[[Delta], bytes]:
    """A delta's SSE events: its chunk, or with tools the chunks of its content and calls
    (gateway/tools/output.py; none while text is held back)."""
    tools = fmt.tools
    if tools is None:
        return lambda delta: sse(fmt.chunk(delta))
    streams: dict[int, ChoiceDeltas] = {}

    def events(delta: Delta) -> bytes:
        stream = streams.setdefault(delta.index, tools.stream())
        return b"".join(sse(fmt.chat_chunk(delta.index, body, finish))
                        for body, finish in stream.feed(delta.text, delta.finish_reason))
    return events


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
            await unless_disconnected(self._stream(send), receive)
        finally:
            await self.body_iterator.aclose()

    async def _stream(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})
        try:
            async for chunk in self.body_iterator:
                last = chunk.endswith(DONE)  # NOTE: the end goes out with [DONE]
                await send({"type": "http.response.body", "body": chunk, "more_body": not last})
                if last:
                    return
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:  # ASGI 2.4 servers report a vanished client this way
            logger.info("client went away mid-stream")
