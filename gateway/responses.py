"""The JSON shapes of OpenAI completion and chat responses and their stream chunks."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from starlette.responses import Response

from gateway.errors import json_bytes
from gateway.generation import Delta
from gateway.logprobs import Scored, TokenPieces, chat_logprobs, completion_logprobs
from gateway.tools.output import ToolOutput


class OrjsonResponse(Response):
    """A JSON response serialized with orjson."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return json_bytes(content)


def json_response(content: Any, status_code: int = 200,
                  headers: Mapping[str, str] | None = None) -> OrjsonResponse:
    return OrjsonResponse(content, status_code=status_code, headers=headers)


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0
          ) -> dict[str, Any]:
    """OpenAI's usage object; `cached_tokens`: prompt tokens served from the prefix cache."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


@dataclass(frozen=True, slots=True)
class ResponseFormat:
    """How one request's responses look: `text_completion` or `chat.completion` objects."""

    chat: bool
    id: str  # cmpl-... or chatcmpl-...
    created: int  # unix s
    model: str
    include_usage: bool = False  # stream_options.include_usage: `usage` on every chunk
    pieces: TokenPieces | None = None  # set when the request asked for log-probs

    def logprobs(self, scored: tuple[Scored, ...] | list[Scored],
                 text_offset: int = 0) -> dict[str, Any] | None:
        """A choice's `logprobs` object over these tokens; None when it asked for none."""
        if self.pieces is None:
            return None
        if self.chat:
            return chat_logprobs(scored, self.pieces)
        return completion_logprobs(scored, self.pieces, text_offset)
    tools: ToolOutput | None = None  # chat with tools: read the text for calls

    def _base(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def response(self, texts: list[str], finishes: list[str | None], used: dict[str, Any],
                 scored: list[list[Scored]] | None = None) -> dict[str, Any]:
        """The non-streaming response, one choice per text (`scored`: each one's tokens
        with their log-probs)."""
        lps = [self.logprobs(s) for s in scored or [[] for _ in texts]]
        if self.chat:
            choices = [{"index": i, **self._message(text, finish), "logprobs": lp}
                       for i, (text, finish, lp) in enumerate(zip(texts, finishes, lps,
                                                                  strict=True))]
            return {**self._base("chat.completion"), "choices": choices, "usage": used}
        choices = [{"index": i, "text": text, "logprobs": lp, "finish_reason": finish}
                   for i, (text, finish, lp) in enumerate(zip(texts, finishes, lps,
                                                              strict=True))]
        return {**self._base("text_completion"), "choices": choices, "usage": used}

    def _message(self, text: str, finish: str | None) -> dict[str, Any]:
        if self.tools is None:
            return {"message": {"role": "assistant", "content": text}, "finish_reason": finish}
        message, finish = self.tools.message(text, finish)
        return {"message": message, "finish_reason": finish}

    def chat_chunk(self, index: int, delta: dict[str, Any], finish_reason: str | None
                   ) -> dict[str, Any]:
        """A chat chunk of a given `delta` body (tool-call deltas)."""
        return self._chunk({"index": index, "delta": delta, "logprobs": None,
                            "finish_reason": finish_reason})

    def role_chunk(self, index: int) -> dict[str, Any]:
        """Chat streams open each choice with the assistant role."""
        choice = {"index": index, "delta": {"role": "assistant", "content": ""},
                  "logprobs": None, "finish_reason": None}
        return self._chunk(choice)

    def chunk(self, delta: Delta) -> dict[str, Any]:
        lp = None if self.pieces is None else self.logprobs(delta.logprobs, delta.text_offset)
        if self.chat:
            body = {"content": delta.text} if delta.text else {}
            choice = {"index": delta.index, "delta": body, "logprobs": lp,
                      "finish_reason": delta.finish_reason}
        else:
            choice = {"index": delta.index, "text": delta.text, "logprobs": lp,
                      "finish_reason": delta.finish_reason}
        return self._chunk(choice)

    def usage_chunk(self, used: dict[str, Any]) -> dict[str, Any]:
        """The last chunk when include_usage is set: no choices, the request's usage."""
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._base(obj), "choices": [], "usage": used}

    def _chunk(self, choice: dict[str, Any]) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        out = {**self._base(obj), "choices": [choice]}
        if self.include_usage:
            out["usage"] = None
        return out
