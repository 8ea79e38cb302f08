"""A conversation with tools as a chat template takes it.

A template that renders tools itself (`formats.template_supports_tools`) gets them as
`apply_chat_template(..., tools=[...])` and messages in the shape HF templates expect
(an assistant's `tool_calls` with `arguments` as an object, `tool` messages with their
`tool_call_id`); any other gets the generic prompt (`generic_prompt`) as plain text.
Tools are offered unless `tool_choice` is "none"; past calls and results are always shown.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from gateway.tools import generic_prompt
from gateway.tools.types import Tool, ToolCall

if TYPE_CHECKING:
    from gateway.protocol import ChatMessage

Conversation = list[dict[str, Any]]
TemplateTools = list[dict[Any, Any] | Callable[..., Any]]  # as apply_chat_template types it


def conversation(messages: Sequence[ChatMessage], tools: Sequence[Tool], native: bool
                 ) -> tuple[Conversation, TemplateTools | None]:
    """The template's messages and its `tools` argument (None: no tools for the template).

    `tools`: those offered to the model; `native`: the template renders tools itself."""
    if native:
        defs: TemplateTools = [t.as_openai() for t in tools]
        return [_native(m) for m in messages], defs or None
    out = [_generic(m) for m in messages]
    if tools:
        block = generic_prompt.SYSTEM_BLOCK.format(
            tools="\n".join(json.dumps(t.as_openai(), ensure_ascii=False) for t in tools))
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{block}"}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out, None


def _role(message: ChatMessage) -> str:
    # NOTE: templates rarely know OpenAI's newer "developer" role; it means "system".
    return "system" if message.role == "developer" else message.role


def _native(message: ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": _role(message), "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.name, "arguments": arguments(c)}}
                             for c in message.tool_calls]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out


def _generic(message: ChatMessage) -> dict[str, Any]:
    if message.role == "tool":
        return {"role": generic_prompt.RESULT_ROLE,
                "content": generic_prompt.RESULT.format(content=message.content)}
    calls = [generic_prompt.CALL.format(call=json.dumps(
        {"name": c.name, "arguments": arguments(c)}, ensure_ascii=False))
        for c in message.tool_calls]
    content = "\n".join([message.content, *calls] if message.content else calls)
    return {"role": _role(message), "content": content}


def arguments(call: ToolCall) -> Any:
    """A call's arguments as an object, as templates take them (the text if it is not one)."""
    try:
        value = json.loads(call.arguments)
    except ValueError:
        return call.arguments
    return value if isinstance(value, dict) else call.arguments
