"""One streaming ``/v1/completions`` request, timed token by token.

``stream_completion`` sends ``stream: true`` with ``stream_options.include_usage``
and asks for exactly ``max_tokens`` output tokens in the server's dialect:
``vllm`` (vLLM and slicegate: ``ignore_eos`` + ``min_tokens``, and the body
``priority``), ``transformers`` (``transformers serve``: a ``generation_config``
with ``min_new_tokens``; it rejects unknown fields) or ``openai`` (nothing
beyond ``max_tokens``: outputs may end early at EOS). It fills a ``RequestRecord``
as the SSE chunks arrive. It never raises for an HTTP or network failure: the
record carries the status and the error instead. Cancelling it (end of a
bounded run, Ctrl-C) closes the stream, which tells the server to abort.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

CANCELLED = "cancelled"  # RequestRecord.error of a request the replay cancelled
DIALECTS = ("vllm", "transformers", "openai")
_MAX_ERROR_CHARS = 300


@dataclass(slots=True)
class RequestRecord:
    """What happened to one request. Times are seconds since the replay's origin."""

    tenant: str
    index: int  # request number within its tenant
    send_s: float
    planned_prompt_tokens: int
    planned_output_tokens: int
    first_token_s: float | None = None
    token_s: list[float] = field(default_factory=list)  # arrival of each streamed token chunk
    end_s: float | None = None  # the stream ended (or failed)
    prompt_tokens: int | None = None  # usage.prompt_tokens
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens, if sent
    output_tokens: int = 0  # usage.completion_tokens, else the token chunks seen
    finish_reason: str | None = None
    status: int = 0  # HTTP status; 0 when no response came back
    error: str | None = None  # None on success
    retry_after: str | None = None  # the Retry-After header of a refusal (429/503)
    error_code: str | None = None  # the OpenAI error `code` of a refusal or a stream error

    @property
    def ok(self) -> bool:
        return self.error is None and self.status == 200

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.send_s

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first (None below 2 tokens)."""
        if self.first_token_s is None or len(self.token_s) < 2 or self.output_tokens < 2:
            return None
        return (self.token_s[-1] - self.first_token_s) / (self.output_tokens - 1)

    @property
    def error_key(self) -> str | None:
        """How the report groups this failure: the HTTP status, or what went wrong without one."""
        if self.ok:
            return None
        error = self.error or "error"
        if self.status not in (0, 200):
            return str(self.status)
        if error == CANCELLED or error.startswith("timeout"):
            return error.split(":")[0]
        return error.split(":")[0] if self.status == 0 else "stream error"


@dataclass(frozen=True, slots=True)
class CompletionCall:
    """The request to send: the body fields loadgen controls and the tenant's credentials."""

    model: str
    prompt: str
    max_tokens: int
    api_key: str = ""
    priority: int | None = None  # body "priority", vLLM's sense; None: not sent
    dialect: str = "vllm"  # one of DIALECTS

    def __post_init__(self) -> None:
        if self.dialect not in DIALECTS:
            raise ValueError(f"unknown dialect {self.dialect!r} (known: {', '.join(DIALECTS)})")

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": self.prompt,
            "max_tokens": self.max_tokens,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.dialect == "vllm":
            body.update(min_tokens=self.max_tokens, ignore_eos=True)
            if self.priority is not None:
                body["priority"] = self.priority
        elif self.dialect == "transformers":
            body["generation_config"] = json.dumps({
                "max_new_tokens": self.max_tokens, "min_new_tokens": self.max_tokens,
                "do_sample": False})
        return body

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def now_s(origin: float) -> float:
    """Seconds since ``origin`` (a ``time.monotonic()`` reading)."""
    return time.monotonic() - origin


async def stream_completion(client: httpx.AsyncClient, call: CompletionCall,
                            record: RequestRecord, origin: float) -> RequestRecord:
    """Send ``call`` to ``/v1/completions`` on ``client`` and fill ``record`` as it streams."""
    record.send_s = now_s(origin)
    try:
        async with client.stream("POST", "/v1/completions", json=call.body(),
                                 headers=call.headers()) as response:
            record.status = response.status_code
            if response.status_code != 200:
                record.retry_after = response.headers.get("retry-after")
                body = await response.aread()
                record.error, record.error_code = _error_text(body), _error_code(body)
            else:
                await read_sse(response.aiter_lines(), record, origin)
    except asyncio.CancelledError:
        record.error = CANCELLED
        raise
    except httpx.TimeoutException as exc:
        record.error = f"timeout: {type(exc).__name__}"
    except httpx.HTTPError as exc:
        record.error = f"{type(exc).__name__}: {exc}"[:_MAX_ERROR_CHARS]
    finally:
        record.end_s = now_s(origin)
        if not record.output_tokens:
            record.output_tokens = len(record.token_s)
    return record


async def read_sse(lines: AsyncIterator[str], record: RequestRecord, origin: float) -> None:
    """Fill ``record`` from the SSE lines of a completion stream, up to ``data: [DONE]``
    (each chunk timed on arrival, seconds since ``origin``); a stream that ends without a
    finish_reason, or carries an error, leaves ``record.error`` set."""
    done = False
    async for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            done = True
            break
        _on_chunk(_parse_chunk(data), record, now_s(origin))
        if record.error is not None:
            return
    # NOTE: transformers serve ends its stream after the usage chunk, without [DONE].
    if not done and record.error is None and record.finish_reason is None:
        record.error = "stream ended before a finish_reason"


def _parse_chunk(data: str) -> dict[str, Any]:
    try:
        chunk = json.loads(data)
    except json.JSONDecodeError:
        return {"error": {"message": f"bad SSE chunk: {data[:100]!r}"}}
    return chunk if isinstance(chunk, dict) else {"error": {"message": "SSE chunk not an object"}}


def _on_chunk(chunk: dict[str, Any], record: RequestRecord, t: float) -> None:
    if "error" in chunk:
        body = json.dumps(chunk).encode()
        record.error, record.error_code = _error_text(body), _error_code(body)
        return
    for choice in chunk.get("choices") or ():
        text, finish = choice.get("text"), choice.get("finish_reason")
        # NOTE: a last chunk with only a finish_reason carries no token.
        if text or finish is None:
            record.token_s.append(t)
            if record.first_token_s is None:
                record.first_token_s = t
        if finish is not None:
            record.finish_reason = finish
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        record.prompt_tokens = usage.get("prompt_tokens")
        record.output_tokens = int(usage.get("completion_tokens") or 0)
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            record.cached_tokens = details["cached_tokens"]


def _error_code(body: bytes) -> str | None:
    try:
        code = json.loads(body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None
    return str(code) if code is not None else None


def _error_text(body: bytes) -> str:
    """The message of an OpenAI error envelope, else the start of the body."""
    text = body.decode("utf-8", "replace")
    try:
        message = json.loads(text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = text
    return str(message)[:_MAX_ERROR_CHARS] or "empty error body"
