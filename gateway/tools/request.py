"""`tools`, `tool_choice`, `parallel_tool_calls` and the tool parts of chat messages,
validated as OpenAI does: a 400 naming the param for anything malformed.

The legacy `functions` / `function_call` stay refused (400 `unsupported_parameter`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gateway.errors import invalid
from gateway.fields import Fields, range_error, type_error
from gateway.tools.types import AUTO, FUNCTION, NONE, REQUIRED, Tool, ToolCall, ToolRequest

NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # OpenAI's rule for function names
CHOICES = (NONE, AUTO, REQUIRED)


def parse_tool_request(body: Mapping[str, Any]) -> ToolRequest | None:
    """The request's tools; None when it sends none (and no tool_choice needing them)."""
    fields = Fields(body)
    tools = _tools(body.get("tools"))
    parallel = fields.bool_("parallel_tool_calls", True)
    choice, function = _choice(body.get("tool_choice"), tools)
    if not tools:
        return None
    return ToolRequest(tools, choice, function, bool(parallel))


def _tools(value: Any) -> tuple[Tool, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise type_error("tools", "an array of tools", value)
    tools = tuple(_tool(t, f"tools[{i}]") for i, t in enumerate(value))
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        if tool.name in seen:
            raise invalid(f"tools[{i}].function.name", f"Duplicate function name "
                                                       f"{tool.name!r} in 'tools'.",
                          code="invalid_value")
        seen.add(tool.name)
    return tools


def _tool(value: Any, param: str) -> Tool:
    if not isinstance(value, dict):
        raise type_error(param, "an object", value)
    if value.get("type") != "function":
        raise range_error(f"{param}.type", "'function'", value.get("type"))
    function = Fields(value, f"{param}.").obj("function")
    if function is None:
        raise invalid(f"{param}.function", f"'{param}.function' is required.",
                      code="missing_required_parameter")
    name = _name(function.raw("name"), function.name("name"))
    parameters = function.raw("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise type_error(function.name("parameters"), "a JSON schema object", parameters)
    strict = function.raw("strict")
    return Tool(name, function.str_("description"), parameters,
                None if strict is None else function.bool_("strict", False))


def _name(value: Any, param: str) -> str:
    if value is None:
        raise invalid(param, f"'{param}' is required.", code="missing_required_parameter")
    if not isinstance(value, str):
        raise type_error(param, "a string", value)
    if not NAME.match(value):
        raise invalid(param, f"Invalid '{param}': {value[:80]!r} does not match "
                             f"'{NAME.pattern}'.", code="invalid_value")
    return value


def _choice(value: Any, tools: tuple[Tool, ...]) -> tuple[str, str | None]:
    if value is None:
        return AUTO if tools else NONE, None
    if isinstance(value, str):
        if value not in CHOICES:
            raise range_error("tool_choice", f"in {', '.join(CHOICES)} or a function",
                              value)
        if value == REQUIRED and not tools:
            raise invalid("tool_choice", "'tool_choice' is only allowed when 'tools' are "
                                         "specified.")
        return value, None
    if not isinstance(value, dict):
        raise type_error("tool_choice", "a string or an object", value)
    if value.get("type") != "function":
        raise range_error("tool_choice.type", "'function'", value.get("type"))
    function = Fields(value, "tool_choice.").obj("function")
    if function is None:
        raise invalid("tool_choice.function", "'tool_choice.function' is required.",
                      code="missing_required_parameter")
    name = _name(function.raw("name"), "tool_choice.function.name")
    if name not in {t.name for t in tools}:
        raise invalid("tool_choice.function.name", f"Invalid 'tool_choice': no function "
                                                   f"named {name!r} in 'tools'.",
                      code="invalid_value")
    return FUNCTION, name


def parse_tool_calls(value: Any, param: str) -> tuple[ToolCall, ...]:
    """An assistant message's `tool_calls` (param: `messages[i].tool_calls`)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise type_error(param, "an array of tool calls", value)
    return tuple(_call(c, f"{param}[{j}]") for j, c in enumerate(value))


def _call(value: Any, param: str) -> ToolCall:
    if not isinstance(value, dict):
        raise type_error(param, "an object", value)
    fields = Fields(value, f"{param}.")
    call_id = fields.str_("id")
    if not call_id:
        raise invalid(f"{param}.id", f"'{param}.id' is required.",
                      code="missing_required_parameter")
    if value.get("type", "function") != "function":
        raise range_error(f"{param}.type", "'function'", value.get("type"))
    function = fields.obj("function")
    if function is None:
        raise invalid(f"{param}.function", f"'{param}.function' is required.",
                      code="missing_required_parameter")
    name = function.str_("name")
    if not name:
        raise invalid(function.name("name"), f"'{function.name('name')}' is required.",
                      code="missing_required_parameter")
    arguments = function.str_("arguments")
    if arguments is None:
        raise invalid(function.name("arguments"), f"'{function.name('arguments')}' is "
                                                  "required.", code="missing_required_parameter")
    return ToolCall(call_id, name, arguments)
