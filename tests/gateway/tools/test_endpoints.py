"""Tool calls end to end: the official `openai` client over the app on a fake scheduler
scripted to write a Hermes call (the tiny model's template has no tools: the generic
prompt), streamed and not; tool results back into the next prompt; a Batch API line."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest

from gateway.engine import Engine
from scheduler.api import Request
from tests.gateway.batches.helpers import line, results, submit, wait_for
from tests.gateway.harness import EngineFactory, Harness, auth_config, make_config, running

OUTPUT = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": '
          '"Paris"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n'
          '</tool_call>')
TOOLS: list[Any] = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather in a city", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}},
            "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time"}}]
pytestmark = pytest.mark.asyncio(loop_scope="session")

CONTEXT = 2048
ASK: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]


def _engine(make: EngineFactory) -> Engine:
    """An engine whose fake writes OUTPUT, with room for the generic tool prompt."""
    script = tuple(make.tokenizer.encode(OUTPUT, add_special_tokens=False))
    return dataclasses.replace(make(script=script, max_model_len=CONTEXT),
                               max_model_len=CONTEXT)


@pytest.fixture
async def scripted(make_engine: EngineFactory) -> AsyncIterator[Harness]:
    async with running(make_config(), _engine(make_engine)) as harness:
        yield harness


@pytest.fixture
def prompts(scripted: Harness) -> list[str]:
    """The text of every prompt the scheduler was handed."""
    seen: list[str] = []
    submit_ = scripted.fake.submit

    def record(request: Request):  # type: ignore[no-untyped-def]
        seen.append(scripted.engine.tokenizer.decode(request.prompt_token_ids))
        return submit_(request)

    scripted.fake.submit = record  # type: ignore[method-assign]
    return seen


def _client(harness: Harness) -> openai.AsyncOpenAI:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=harness.app))
    return openai.AsyncOpenAI(base_url="http://gateway/v1", api_key="none", max_retries=0,
                              http_client=http)


async def test_calls_through_the_openai_client(scripted: Harness, prompts: list[str]) -> None:
    async with _client(scripted) as client:
        whole = await client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check.\n"
    calls = choice.message.tool_calls
    assert calls is not None and [c.function.name for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}
    assert all(c.id.startswith("call_") and c.type == "function" for c in calls)
    assert "# Tools" in prompts[0] and '"name": "get_weather"' in prompts[0]


async def test_streamed_calls_accumulate_as_the_sdk_does(scripted: Harness) -> None:
    async with _client(scripted) as client:
        stream = await client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS,
                                                      stream=True)
        chunks = [chunk async for chunk in stream]
        async with client.chat.completions.stream(model="tiny", messages=ASK,
                                                  tools=TOOLS) as helper:
            final = await helper.get_final_completion()
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == "Let me check.\n"
    heads = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or []) if tc.id]
    assert [(h.index, h.function.name, h.function.arguments) for h in heads if h.function] == [
        (0, "get_weather", ""), (1, "get_time", "")]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    message = final.choices[0].message  # the SDK's own accumulation of the deltas
    assert final.choices[0].finish_reason == "tool_calls"
    assert message.tool_calls is not None
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [
        ("get_weather", {"city": "Paris"}), ("get_time", {})]


async def test_parallel_false_and_none(scripted: Harness) -> None:
    async with _client(scripted) as client:
        one = await client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS,
                                                   parallel_tool_calls=False)
        none = await client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS,
                                                    tool_choice="none")
    assert [c.function.name for c in one.choices[0].message.tool_calls or []] == ["get_weather"]
    assert none.choices[0].message.tool_calls is None
    assert none.choices[0].message.content == OUTPUT
    assert none.choices[0].finish_reason == "stop"


async def test_tool_results_round_trip_into_the_next_prompt(scripted: Harness,
                                                           prompts: list[str]) -> None:
    async with _client(scripted) as client:
        first = await client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS)
        message = first.choices[0].message
        assert message.tool_calls is not None
        history: list[Any] = [*ASK, message.model_dump(exclude_none=True)]
        history += [{"role": "tool", "tool_call_id": c.id, "content": f"result of {c.id}"}
                    for c in message.tool_calls]
        await client.chat.completions.create(model="tiny", messages=history, tools=TOOLS)
    second = prompts[1]
    assert ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
            '</tool_call>') in second
    for call in message.tool_calls:
        assert f"<tool_response>\nresult of {call.id}\n</tool_response>" in second


async def test_a_batch_line_gets_tool_calls(make_engine: EngineFactory) -> None:
    key = "sk-nightly-1"
    async with running(auth_config(), _engine(make_engine)) as h:
        lines = [line(0, max_tokens=200, tools=TOOLS), line(1, max_tokens=200)]
        done = await wait_for(h.client, key, (await submit(h.client, key, lines))["id"])
        out = await results(h.client, key, done["output_file_id"])
    with_tools, without = (x["response"]["body"]["choices"][0] for x in out)
    assert with_tools["finish_reason"] == "tool_calls"
    assert [c["function"]["name"] for c in with_tools["message"]["tool_calls"]] == [
        "get_weather", "get_time"]
    assert "tool_calls" not in without["message"] and without["message"]["content"] == OUTPUT
