"""Structured output end to end on the default model: json_schema, json_object, regex, choice
and grammar through the official openai client (streamed and not) and the app; bad specs
are 400s naming the param."""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from gateway.config import load_config
from gateway.engine import Engine, build_engine
from tests.gateway.batches.helpers import line as batch_line
from tests.gateway.batches.helpers import results, submit, wait_for
from tests.gateway.harness import LiveServer, auth_config, live_server

KEY = {"Authorization": "Bearer sk-ide-1"}
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    config = load_config(None, {"model.spec": "default", "scheduler.devices": "cpu:0"})
    yield build_engine(config)


@pytest.fixture(scope="module")
def live(engine: Engine) -> Iterator[LiveServer]:
    with live_server(auth_config(), engine) as server:
        yield server


def _schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "t", "schema": schema, "strict": True}}


def _chat(live: LiveServer, content: str, **body: Any) -> dict[str, Any]:
    r = httpx.post(f"{live.url}/v1/chat/completions", headers=KEY, timeout=120, json={
        "messages": [{"role": "user", "content": content}], "max_tokens": 120,
        "temperature": 0, **body})
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def test_the_openai_client_streamed_and_not_gets_a_valid_object(live: LiveServer) -> None:
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="sk-ide-1", max_retries=0)
    messages: Any = [{"role": "user", "content": "Describe Ada Lovelace as JSON."}]
    done = client.chat.completions.create(model="default", messages=messages, max_tokens=80,
                                          temperature=0, response_format=_schema_format(PERSON))
    assert done.choices[0].finish_reason == "stop"
    text = done.choices[0].message.content or ""
    jsonschema.validate(json.loads(text), PERSON)
    stream = client.chat.completions.create(model="default", messages=messages, max_tokens=80,
                                            temperature=0, stream=True,
                                            response_format=_schema_format(PERSON))
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == text
    plain = client.completions.create(model="default", prompt="A person as JSON:",
                                      max_tokens=80, temperature=0,
                                      extra_body={"structured_outputs": {"json": PERSON}})
    jsonschema.validate(json.loads(plain.choices[0].text), PERSON)


LEAVES = [{"type": "string", "maxLength": 12}, {"type": "integer"}, {"type": "boolean"},
          {"enum": ["red", "green", "blue"]}, {"type": "number"}]
NAMES = ["id", "name", "color", "size", "ok", "tags"]


def random_schema(rng: random.Random, depth: int = 2) -> dict[str, Any]:
    """An object schema: 1-3 properties, each a leaf, an array of leaves or (while `depth`
    lasts) a nested object; each property required or not by a coin."""
    props: dict[str, Any] = {}
    for name in rng.sample(NAMES, rng.randint(1, 3)):
        kind = rng.choice(["leaf", "array", "object"] if depth > 1 else ["leaf", "array"])
        props[name] = (rng.choice(LEAVES) if kind == "leaf" else random_schema(rng, depth - 1)
                       if kind == "object" else
                       {"type": "array", "items": rng.choice(LEAVES), "maxItems": 3})
    return {"type": "object", "properties": props,
            "required": [n for n in props if rng.random() < 0.5],
            "additionalProperties": False}


async def test_fifty_outputs_under_strict_schemas_all_validate(live: LiveServer) -> None:
    """50 random schemas sent at once (one mixed batch); sampled at temperature 0.7, every
    output ends by the grammar (not max_tokens) and validates."""
    async def one(client: openai.AsyncOpenAI,
                  seed: int) -> tuple[dict[str, Any], str | None, str | None]:
        schema = random_schema(random.Random(seed))
        done = await client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "Some JSON, please."}],
            max_tokens=160, temperature=0.7, seed=seed, response_format=_schema_format(schema))
        return schema, done.choices[0].finish_reason, done.choices[0].message.content

    async with openai.AsyncOpenAI(base_url=f"{live.url}/v1", api_key="sk-ide-1",
                                  max_retries=0, timeout=300) as client:
        outs = await asyncio.gather(*(one(client, seed) for seed in range(50)))
    assert len({json.dumps(schema, sort_keys=True) for schema, _, _ in outs}) >= 40
    for schema, finish, text in outs:
        assert finish == "stop", text
        jsonschema.validate(json.loads(text or ""), schema)


def test_json_object_regex_choice_and_grammar(live: LiveServer) -> None:
    out = _chat(live, 'Repeat exactly: {"ok": true}', response_format={"type": "json_object"})
    assert out["choices"][0]["finish_reason"] == "stop"
    assert isinstance(json.loads(out["choices"][0]["message"]["content"]), dict)
    out = _chat(live, "A phone number?", structured_outputs={"regex": r"\d{3}-\d{4}"})
    assert re.fullmatch(r"\d{3}-\d{4}", out["choices"][0]["message"]["content"])
    out = _chat(live, "Is the sky blue?", guided_choice=["yes", "no"])
    assert out["choices"][0]["message"]["content"] in ("yes", "no")
    assert out["choices"][0]["finish_reason"] == "stop"
    out = _chat(live, "Greet me.", guided_grammar='root ::= "hello" | "hi there"')
    assert out["choices"][0]["message"]["content"] in ("hello", "hi there")


@pytest.mark.parametrize(("body", "param"), [
    ({"guided_regex": "[0-9"}, "guided_regex"),
    ({"structured_outputs": {"json": {"type": "nope"}}}, "structured_outputs.json"),
    ({"response_format": _schema_format({"type": "nope"})},
     "response_format.json_schema.schema"),
    ({"structured_outputs": {"grammar": "start: ???"}}, "structured_outputs.grammar"),
    ({"guided_choice": []}, "guided_choice"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
])
def test_bad_specs_are_400s_naming_the_param(live: LiveServer, body: dict[str, Any],
                                             param: str) -> None:
    r = httpx.post(f"{live.url}/v1/completions", headers=KEY, timeout=60,
                   json={"prompt": "x", "max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 24},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {
        "zone": {"type": "string", "maxLength": 24}}, "required": ["zone"]}}}


@pytest.mark.parametrize("choice", [
    "required", {"type": "function", "function": {"name": "get_weather"}}])
@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_tool_choice_returns_calls_whose_arguments_validate(
        live: LiveServer, choice: Any, stream: bool) -> None:
    """The default model never learnt tools; `tool_choice` "required" or a named function
    still gets a call whose arguments validate against the function's parameters."""
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="sk-ide-1", max_retries=0)
    messages: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
    kw: Any = {"model": "default", "messages": messages, "max_tokens": 80, "temperature": 0,
               "tools": [WEATHER, TIME], "tool_choice": choice, "parallel_tool_calls": False}
    if stream:
        with client.beta.chat.completions.stream(**kw) as s:
            done = s.get_final_completion()
    else:
        done = client.chat.completions.create(**kw)
    [c] = done.choices
    assert c.finish_reason == "tool_calls", c
    [call] = c.message.tool_calls or []
    schemas = {"get_weather": WEATHER, "get_time": TIME}
    if choice != "required":
        assert call.function.name == "get_weather"
    fn: Any = schemas[call.function.name]["function"]
    jsonschema.validate(json.loads(call.function.arguments), fn["parameters"])


async def test_batch_lines_get_structured_output_and_forced_calls(live: LiveServer) -> None:
    """A Batch API file's lines go through the same parsing: a json_schema line's output
    validates, a forced tool_choice line's output is a call."""
    key = "sk-nightly-1"
    ask: Any = [{"role": "user", "content": "Describe Ada Lovelace as JSON."}]
    lines = [batch_line(0, messages=ask, max_tokens=80, temperature=0,
                        response_format=_schema_format(PERSON)),
             batch_line(1, messages=ask, max_tokens=80, temperature=0, tools=[WEATHER],
                        tool_choice="required", parallel_tool_calls=False)]
    async with httpx.AsyncClient(base_url=live.url, timeout=60) as client:
        batch = await submit(client, key, lines)
        done = await wait_for(client, key, batch["id"], timeout_s=300)
        out = {r["custom_id"]: r["response"]["body"]
               for r in await results(client, key, done["output_file_id"])}
    assert done["request_counts"]["completed"] == 2, done
    [person] = out["req-0"]["choices"]
    jsonschema.validate(json.loads(person["message"]["content"]), PERSON)
    [called] = out["req-1"]["choices"]
    assert called["finish_reason"] == "tool_calls", called
    [call] = called["message"]["tool_calls"]
    fn: Any = WEATHER["function"]
    jsonschema.validate(json.loads(call["function"]["arguments"]), fn["parameters"])

