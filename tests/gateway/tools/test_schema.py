"""The JSON schema "required" and a named tool_choice are to be enforced with."""

from __future__ import annotations

import jsonschema
import pytest

from gateway.tools.schema import calls_schema
from gateway.tools.types import Tool, ToolRequest

WEATHER = Tool("get_weather", None, {"type": "object", "properties": {
    "city": {"type": "string"}}, "required": ["city"]})
NOW = Tool("now")
PARIS = {"name": "get_weather", "arguments": {"city": "Paris"}}


def _valid(schema: object, value: object) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(value)  # type: ignore[arg-type]


def test_auto_and_none_leave_the_model_free() -> None:
    assert calls_schema(ToolRequest((WEATHER,), "auto")) is None
    assert calls_schema(ToolRequest((WEATHER,), "none")) is None


def test_required_takes_any_offered_function() -> None:
    schema = calls_schema(ToolRequest((WEATHER, NOW), "required"))
    assert _valid(schema, [PARIS, {"name": "now", "arguments": {}}])
    assert not _valid(schema, [])
    assert not _valid(schema, [{"name": "get_weather", "arguments": {}}])  # city required
    assert not _valid(schema, [{"name": "other", "arguments": {}}])
    single = calls_schema(ToolRequest((WEATHER, NOW), "required", parallel=False))
    assert _valid(single, [PARIS]) and not _valid(single, [PARIS, PARIS])


def test_named_takes_that_function_once() -> None:
    schema = calls_schema(ToolRequest((WEATHER, NOW), "function", "now"))
    assert _valid(schema, [{"name": "now", "arguments": {}}])
    assert not _valid(schema, [PARIS])
    assert not _valid(schema, [{"name": "now", "arguments": {}}] * 2)


@pytest.mark.parametrize("choice", ["required", "function"])
def test_schema_is_plain_json(choice: str) -> None:
    import json
    schema = calls_schema(ToolRequest((WEATHER,), choice, "get_weather"))
    assert json.loads(json.dumps(schema)) == schema
