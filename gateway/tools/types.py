"""Tool values shared by the request, the prompt and the output: frozen, JSON-free."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

NONE, AUTO, REQUIRED, FUNCTION = "none", "auto", "required", "function"  # tool_choice modes

EMPTY_PARAMETERS: Mapping[str, Any] = MappingProxyType({"type": "object", "properties": {}})
# the parameters of a function that does not declare any, as OpenAI reads it


@dataclass(frozen=True, slots=True)
class Tool:
    """One `{"type": "function", "function": {...}}` of a request's `tools`."""

    name: str
    description: str | None = None
    parameters: Mapping[str, Any] | None = None  # a JSON schema of the arguments
    strict: bool | None = None  # accepted; not enforced

    @property
    def schema(self) -> Mapping[str, Any]:
        """The arguments' JSON schema (an empty object's when none was declared)."""
        return EMPTY_PARAMETERS if self.parameters is None else self.parameters

    def as_openai(self) -> dict[str, Any]:
        """The tool as OpenAI sends it, which is also what HF chat templates take."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = plain(self.schema)
        return {"type": "function", "function": function}


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A function call, in an assistant message or in generated text."""

    id: str
    name: str
    arguments: str  # JSON text, as OpenAI carries it


@dataclass(frozen=True, slots=True)
class ToolRequest:
    """A chat request's `tools`, `tool_choice` and `parallel_tool_calls`, validated."""

    tools: tuple[Tool, ...]
    choice: str = AUTO  # NONE | AUTO | REQUIRED | FUNCTION
    function: str | None = None  # the name, with choice FUNCTION
    parallel: bool = True  # False: keep the first call only

    @property
    def offered(self) -> bool:
        """Whether the model is shown the tools (not with tool_choice "none")."""
        return bool(self.tools) and self.choice != NONE

    @property
    def forced(self) -> bool:
        """Whether the output must be calls ("required" or a named function), enforced by
        structured output (`gateway.tools.schema.calls_schema`)."""
        return self.choice in (REQUIRED, FUNCTION)

    @property
    def parses(self) -> bool:
        """Whether calls are read out of the generated text."""
        return self.offered


def offered_tools(request: ToolRequest | None) -> tuple[Tool, ...]:
    """The tools the model is shown (none without tools or with tool_choice "none")."""
    return request.tools if request is not None and request.offered else ()


def plain(value: Any) -> Any:
    """`value` with read-only mappings as dicts (for JSON and Jinja)."""
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value
