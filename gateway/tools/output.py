"""Calls as OpenAI returns them: a message's `tool_calls`, and `tool_calls` stream deltas.

A choice that made calls finishes with `tool_calls` where it would have finished with
`stop`; `parallel_tool_calls: false` keeps its first call only. Streamed, each call goes
out as two deltas once its JSON is complete: `{index, id, type, function: {name,
arguments: ""}}`, then its whole `arguments`.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from gateway.tools.formats import CallFormat
from gateway.tools.parse import FoundCall, parse_calls
from gateway.tools.schema import FORCED
from gateway.tools.stream import CallStream
from gateway.tools.types import ToolRequest

TOOL_CALLS = "tool_calls"  # the finish reason


def call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


def tool_call(call: FoundCall, id_: str | None = None) -> dict[str, Any]:
    return {"id": id_ or call_id(), "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


def finish_reason(reason: str | None, made_calls: bool) -> str | None:
    return TOOL_CALLS if made_calls and reason == "stop" else reason


def tool_output(request: ToolRequest | None, fmt: CallFormat) -> ToolOutput | None:
    """How a request's output is read for calls; None: as plain text."""
    if request is None or not request.parses:
        return None
    return ToolOutput(FORCED if request.forced else fmt, request.parallel)


@dataclass(frozen=True, slots=True)
class ToolOutput:
    """How a request's output is read for calls."""

    format: CallFormat
    parallel: bool = True  # False: the first call only

    def message(self, text: str, finish: str | None) -> tuple[dict[str, Any], str | None]:
        """The choice's assistant message and finish reason."""
        parsed = parse_calls(self.format, text)
        calls = parsed.calls if self.parallel else parsed.calls[:1]
        if not calls:
            return {"role": "assistant", "content": text}, finish
        return ({"role": "assistant", "content": parsed.content,
                 "tool_calls": [tool_call(c) for c in calls]}, finish_reason(finish, True))

    def stream(self) -> ChoiceDeltas:
        return ChoiceDeltas(self)


class ChoiceDeltas:
    """One streamed choice's chat `delta` bodies, each with its finish reason (or None)."""

    def __init__(self, output: ToolOutput) -> None:
        self.output = output
        self.calls = CallStream(output.format)
        self.num_sent = 0

    def feed(self, text: str, finish: str | None) -> list[tuple[dict[str, Any], str | None]]:
        step = self.calls.feed(text)
        out = self._bodies(step.content, step.calls)
        if finish is None:
            return out
        last = self.calls.finish()
        out += self._bodies(last.content, last.calls)
        return [*out, ({}, finish_reason(finish, self.num_sent > 0))]

    def _bodies(self, content: str, calls: tuple[FoundCall, ...]
                ) -> list[tuple[dict[str, Any], str | None]]:
        out: list[tuple[dict[str, Any], str | None]] = []
        if content:
            out.append(({"content": content}, None))
        for call in calls:
            if self.num_sent and not self.output.parallel:
                break
            head = {"index": self.num_sent, "id": call_id(), "type": "function",
                    "function": {"name": call.name, "arguments": ""}}
            args = {"index": self.num_sent, "function": {"arguments": call.arguments}}
            out += [({"tool_calls": [head]}, None), ({"tool_calls": [args]}, None)]
            self.num_sent += 1
        return out
