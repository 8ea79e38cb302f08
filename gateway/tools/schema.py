"""The JSON schema that output must match under `tool_choice` "required" or a named
function, for structured output (the grammar engine) to enforce.

The constrained output is a JSON array of `{"name", "arguments"}` objects, which the
gateway reads as the calls directly (no call markers): "required" allows any offered
function (one item without `parallel_tool_calls`, else at least one), a named choice
exactly that function, once.
"""

from __future__ import annotations

from typing import Any

from gateway.tools.formats import CallFormat
from gateway.tools.types import FUNCTION, REQUIRED, Tool, ToolRequest, plain

# NOTE: what `calls_schema` makes the model write, read as calls: a JSON array of
# {"name", "arguments"} from the output's start (Mistral's list without its marker)
FORCED = CallFormat("forced", triggers=("[",), at_start=True, list_open="[", list_close="]",
                    separator=",", args_keys=("arguments",))


def call_schema(tool: Tool) -> dict[str, Any]:
    """One call of `tool`: its name as a constant, its parameters' schema as arguments."""
    return {"type": "object", "properties": {"name": {"const": tool.name},
                                             "arguments": plain(tool.schema)},
            "required": ["name", "arguments"], "additionalProperties": False}


def calls_schema(request: ToolRequest) -> dict[str, Any] | None:
    """The schema the output must match, or None when the choice leaves the model free."""
    if request.choice == FUNCTION:
        [tool] = [t for t in request.tools if t.name == request.function]
        return {"type": "array", "items": call_schema(tool), "minItems": 1, "maxItems": 1}
    if request.choice != REQUIRED:
        return None
    items = [call_schema(t) for t in request.tools]
    schema: dict[str, Any] = {"type": "array", "minItems": 1,
                              "items": items[0] if len(items) == 1 else {"anyOf": items}}
    if not request.parallel:
        schema["maxItems"] = 1
    return schema
