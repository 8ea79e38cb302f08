"""`tools`, `tool_choice`, `parallel_tool_calls` and tool messages: parsed, or 400s naming
the param."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.errors import ApiError
from gateway.protocol import parse_chat
from gateway.tools.schema import calls_schema
from gateway.tools.types import Tool, ToolCall

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
USER = {"role": "user", "content": "Weather in Paris?"}


def _chat(**body: Any) -> Any:
    return parse_chat({"messages": [USER], **body})


def test_tools_and_choices_parse() -> None:
    body = _chat(tools=[WEATHER, {"type": "function", "function": {"name": "now"}}],
                 parallel_tool_calls=False)
    assert body.tools is not None
    assert body.tools.tools[0] == Tool("get_weather", "Weather in a city",
                                       WEATHER["function"]["parameters"])
    assert body.tools.tools[1].schema == {"type": "object", "properties": {}}
    assert (body.tools.choice, body.tools.parallel, body.tools.parses) == ("auto", False, True)
    none = _chat(tools=[WEATHER], tool_choice="none").tools
    assert none is not None and not none.offered and not none.parses
    assert _chat(tool_choice="none").tools is None


@pytest.mark.parametrize(("body", "param"), [
    ({"tools": {"type": "function"}}, "tools"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
    ({"tools": [{"type": "function"}]}, "tools[0].function"),
    ({"tools": [{"type": "function", "function": {}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
    ({"tools": [WEATHER, {"type": "function", "function": {"name": "get_weather"}}]},
     "tools[1].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "description": 3}}]},
     "tools[0].function.description"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
     "tool_choice.function.name"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"functions": [WEATHER["function"]]}, "functions"),
])
def test_malformed_tools_name_the_param(body: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as err:
        _chat(**body)
    assert err.value.status == 400 and err.value.param == param


@pytest.mark.parametrize("choice", ["required",
                                    {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_choices_are_enforced_by_a_json_schema(choice: Any) -> None:
    body = _chat(tools=[WEATHER], tool_choice=choice)
    structured = body.options.structured
    assert structured is not None and structured.param == "tool_choice"
    assert structured.spec.kind == "json_schema"
    assert json.loads(structured.spec.text) == calls_schema(body.tools)  # type: ignore[arg-type]
    with pytest.raises(ApiError) as err:
        _chat(tools=[WEATHER], tool_choice=choice, response_format={"type": "json_object"})
    assert (err.value.param, err.value.code) == ("response_format", "invalid_value")


def test_auto_leaves_the_output_free() -> None:
    assert _chat(tools=[WEATHER], tool_choice="auto").options.structured is None


def test_tool_messages_parse() -> None:
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    body = parse_chat({"messages": [
        USER, {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "22 C"}]})
    assistant, tool = body.messages[1], body.messages[2]
    assert assistant.content == "" and assistant.tool_calls == (
        ToolCall("call_1", "get_weather", '{"city": "Paris"}'),)
    assert (tool.role, tool.content, tool.tool_call_id) == ("tool", "22 C", "call_1")


@pytest.mark.parametrize(("message", "param"), [
    ({"role": "tool", "content": "x"}, "messages[1].tool_call_id"),
    ({"role": "assistant", "tool_calls": {}}, "messages[1].tool_calls"),
    ({"role": "assistant", "tool_calls": [{"type": "function"}]}, "messages[1].tool_calls[0].id"),
    ({"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f"}}]},
     "messages[1].tool_calls[0].function.arguments"),
    ({"role": "user", "content": "x", "tool_calls": [
        {"id": "c", "function": {"name": "f", "arguments": "{}"}}]}, "messages[1].tool_calls"),
    ({"role": "function", "content": "x"}, "messages[1].role"),
])
def test_malformed_tool_messages_name_the_param(message: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as err:
        parse_chat({"messages": [USER, message]})
    assert err.value.status == 400 and err.value.param == param
