"""One JSONL input line: `{custom_id, method, url, body}`, checked as the live endpoints would.

The body goes through the very parsers of `/v1/chat/completions` and
`/v1/completions` (gateway/protocol.py), so a line that uploads cleanly is
one the live endpoint would accept; only what depends on the tokenizer
(context length) is left to the run, where it lands in the error file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from gateway.batches.types import ENDPOINTS
from gateway.engine import Engine, check_model
from gateway.errors import ApiError
from gateway.protocol import ChatBody, CompletionBody, parse_chat, parse_completion

MAX_CUSTOM_ID_CHARS = 512
Line = tuple[int, str, str]  # (line number, custom_id, body JSON text)


class LineError(ValueError):
    """What is wrong with one input line (the message names the field)."""


@dataclass(frozen=True, slots=True)
class InputLine:
    """A structurally valid line; `body` is the raw request object."""

    custom_id: str
    url: str
    body: dict[str, Any]


def parse_line(raw: bytes | str) -> InputLine:
    """The line's fields (raises LineError); the body itself is checked by `parse_body`."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise LineError(f"not valid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise LineError("must be a JSON object with custom_id, method, url and body")
    custom_id = obj.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise LineError("'custom_id' is required and must be a non-empty string")
    if len(custom_id) > MAX_CUSTOM_ID_CHARS:
        raise LineError(f"'custom_id' is longer than {MAX_CUSTOM_ID_CHARS} characters")
    if obj.get("method") != "POST":
        raise LineError(f"'method' must be \"POST\", got {_short(obj.get('method'))}")
    url = obj.get("url")
    if url not in ENDPOINTS:
        raise LineError(f"'url' must be one of {', '.join(ENDPOINTS)}, got {_short(url)}")
    body = obj.get("body")
    if not isinstance(body, dict):
        raise LineError("'body' is required and must be a JSON object")
    return InputLine(custom_id, str(url), body)


def parse_body(line: InputLine, engine: Engine,
               max_prompts: int) -> ChatBody | CompletionBody:
    """The validated request body (raises the endpoint's own 400 ApiError)."""
    parsed: ChatBody | CompletionBody
    if line.url == "/v1/chat/completions":
        parsed = parse_chat(line.body)
    else:
        parsed = parse_completion(line.body, max_prompts)
    if parsed.options.stream:
        raise ApiError(400, "'stream' is not supported in a batch: results go to the output "
                            "file.", param="stream", code="unsupported_parameter")
    check_model(engine, parsed.options.model)  # the tenant's models: when the line runs
    return parsed


def check_line(raw: bytes, engine: Engine, max_prompts: int) -> InputLine:
    """`parse_line` then `parse_body`, every problem as a LineError."""
    line = parse_line(raw)
    try:
        parse_body(line, engine, max_prompts)
    except ApiError as exc:
        where = f"body.{exc.param}: " if exc.param else "body: "
        raise LineError(where + exc.message) from None
    return line


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:80] + "..."


MAX_BATCH_ERRORS = 100  # validation errors kept on a failed batch


def read_input(path: Path, endpoint: str) -> tuple[list[Line], list[dict[str, Any]]]:
    """An input file's lines as (line number, custom_id, body JSON), or the batch's errors.

    The file was checked line by line at upload; here every line's `url` must
    also be the batch's endpoint, as OpenAI requires.
    """
    lines: list[Line] = []
    errors: list[dict[str, Any]] = []
    with open(path, "rb") as stream:
        for number, raw in enumerate(stream, start=1):
            if not raw.strip():
                continue
            try:
                line = parse_line(raw)
            except LineError as exc:
                problem, param = str(exc), None
            else:
                if line.url == endpoint:
                    lines.append((number, line.custom_id, orjson.dumps(line.body).decode()))
                    continue
                problem = f"the line's url {line.url} is not the batch's endpoint {endpoint}"
                param = "url"
            if len(errors) < MAX_BATCH_ERRORS:
                errors.append({"code": "invalid_request", "message": f"Line {number}: {problem}.",
                               "param": param, "line": number})
    return lines, errors
