"""Structured output fields: OpenAI's `response_format` and vLLM's `structured_outputs` (and
its older `guided_*` spellings), read into one `GrammarSpec` with the param it came from.

A request may ask for one at most. Their shapes are checked here (400 naming the
param); whether the schema, regex or grammar compiles is the engine's to say, at
admission (`constraint_for`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gateway.errors import invalid, unsupported
from gateway.fields import Fields, type_error
from gateway.tools.schema import calls_schema
from gateway.tools.types import ToolRequest
from models.grammar import GrammarError, Grammars, GrammarSpec

STRUCTURED_OUTPUTS = ("json", "regex", "choice", "grammar", "json_object")
GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
          "guided_grammar": "grammar"}


@dataclass(frozen=True, slots=True)
class Structured:
    """A request's grammar and the param that asked for it (named in its errors)."""

    spec: GrammarSpec
    param: str


def _schema(value: Any, param: str) -> GrammarSpec:
    """A JSON schema given as an object or as a JSON string."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise invalid(param, f"Invalid '{param}': not JSON ({exc}).",
                          code="invalid_value") from None
    if not isinstance(value, dict | bool):
        raise type_error(param, "a JSON schema (an object)", value)
    return GrammarSpec.json_schema(value)


def _form(kind: str, value: Any, param: str) -> GrammarSpec:
    if kind == "json":
        return _schema(value, param)
    if kind == "json_object":
        if value is not True:
            raise type_error(param, "true", value)
        return GrammarSpec("json_object", "")
    if kind == "choice":
        if not (isinstance(value, list) and value and all(isinstance(c, str) for c in value)):
            raise type_error(param, "a non-empty array of strings", value)
        return GrammarSpec.choice(value)
    if not isinstance(value, str) or not value:
        raise type_error(param, "a non-empty string", value)
    return GrammarSpec(kind, value)


def _response_format(fields: Fields) -> Structured | None:
    rf = fields.obj("response_format")
    if rf is None:
        return None
    kind = rf.str_("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return Structured(GrammarSpec("json_object", ""), "response_format")
    if kind != "json_schema":
        raise invalid("response_format.type", "Invalid 'response_format.type': must be one of "
                                              "text, json_object, json_schema.",
                      code="invalid_value")
    js = rf.obj("json_schema")
    if js is None or js.raw("schema") is None:
        raise invalid("response_format.json_schema.schema", "'response_format.json_schema."
                      "schema' is required.", code="missing_required_parameter")
    js.str_("name")
    js.bool_("strict", False)
    return Structured(_schema(js.raw("schema"), "response_format.json_schema.schema"),
                      "response_format.json_schema.schema")


def _structured_outputs(fields: Fields) -> list[Structured]:
    so = fields.obj("structured_outputs")
    if so is None:
        return []
    return [Structured(_form(k, so.raw(k), so.name(k)), so.name(k))
            for k in STRUCTURED_OUTPUTS if so.raw(k) is not None]


def parse_structured(fields: Fields) -> Structured | None:
    """The request's grammar, if it asks for one (400 if it asks for more than one)."""
    found = [s for s in [_response_format(fields)] if s is not None]
    found += _structured_outputs(fields)
    found += [Structured(_form(kind, fields.raw(key), key), key)
              for key, kind in GUIDED.items() if fields.raw(key) is not None]
    if len(found) > 1:
        raise invalid(found[1].param, f"Only one structured output may be asked for: "
                                      f"'{found[0].param}' and '{found[1].param}' both are.",
                      code="invalid_value")
    return found[0] if found else None


def constraint_for(grammars: Grammars | None, structured: Structured) -> Any:
    """A new `models.grammar.Constraint` for one generation; 400 naming the param when the
    engine cannot compile it."""
    if grammars is None:
        raise unsupported(structured.param, "this server has no grammar engine")
    try:
        return grammars.constraint(structured.spec)
    except GrammarError as exc:
        raise invalid(structured.param, f"Invalid '{structured.param}': {exc}",
                      code="invalid_value") from None


def for_tools(request: ToolRequest, asked: Structured | None) -> Structured:
    """The grammar that enforces `tool_choice` "required" or a named function (the output
    is then the calls, `gateway.tools.schema.calls_schema`); 400 when the request asks for
    a grammar of its own too."""
    if asked is not None:
        raise invalid(asked.param, f"'{asked.param}' cannot be combined with tool_choice "
                                   f"'{request.choice}': the output is then the tool calls.",
                      code="invalid_value")
    schema = calls_schema(request)
    assert schema is not None, "a forced tool_choice has a schema"
    return Structured(GrammarSpec.json_schema(schema), "tool_choice")
