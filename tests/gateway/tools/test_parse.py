"""Tool calls read from the sample outputs of each family, whole and streamed (parse,
stream, output): streamed deltas add up to the whole answer."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.tools.formats import KNOWN_FORMATS
from gateway.tools.output import ToolOutput
from gateway.tools.parse import FoundCall, parse_calls

HERMES, LLAMA, MISTRAL = (KNOWN_FORMATS[n] for n in ("hermes", "llama3_json", "mistral"))
WEATHER = FoundCall("get_weather", '{"city": "Paris"}')
TIME = FoundCall("get_time", '{"tz": "Europe/Paris", "utc": false}')

# (format, output, content, calls)
SAMPLES: list[tuple[Any, str, str | None, tuple[FoundCall, ...]]] = [
    (HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
             '</tool_call>', None, (WEATHER,)),
    (HERMES, 'Checking both.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": '
             '"Paris"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": '
             '{"tz": "Europe/Paris", "utc": false}}\n</tool_call>\nDone.',
     "Checking both.\n\nDone.", (WEATHER, TIME)),
    (HERMES, '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}',
     None, (WEATHER,)),  # unclosed at the end
    (HERMES, 'no calls here', "no calls here", ()),
    (HERMES, 'x <tool_call>{"name": "get_weather", "arguments": {"city": "Par</tool_call>',
     'x <tool_call>{"name": "get_weather", "arguments": {"city": "Par</tool_call>', ()),
    (HERMES, '<tool_call>{"arguments": {}}</tool_call>',
     '<tool_call>{"arguments": {}}</tool_call>', ()),  # no name: not a call
    (LLAMA, '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
     None, (WEATHER,)),
    (LLAMA, ' {"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", '
            '"parameters": {"tz": "Europe/Paris", "utc": false}}', None, (WEATHER, TIME)),
    (LLAMA, 'Sure: {"name": "get_weather", "parameters": {"city": "Paris"}}',
     'Sure: {"name": "get_weather", "parameters": {"city": "Paris"}}', ()),
    (LLAMA, '{"name": "get_weather", "parameters": {"city": "Paris"',
     '{"name": "get_weather", "parameters": {"city": "Paris"', ()),
    (MISTRAL, '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, '
              '{"name": "get_time", "arguments": {"tz": "Europe/Paris", "utc": false}}]',
     None, (WEATHER, TIME)),
    (MISTRAL, 'Let me look. [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": '
              '"Paris"}}]', "Let me look. ", (WEATHER,)),
    (MISTRAL, '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, {"na',
     '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, {"na', ()),
]


@pytest.mark.parametrize(("fmt", "text", "content", "calls"), SAMPLES)
def test_parse_calls(fmt: Any, text: str, content: str | None,
                     calls: tuple[FoundCall, ...]) -> None:
    parsed = parse_calls(fmt, text)
    assert parsed.calls == calls
    assert parsed.content == content


def test_later_malformed_call_keeps_the_good_ones() -> None:
    text = ('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
            '<tool_call>{"name": oops}</tool_call>')
    parsed = parse_calls(HERMES, text)
    assert parsed.calls == (WEATHER,)
    assert parsed.content == '<tool_call>{"name": oops}</tool_call>'


def test_string_arguments_are_kept_as_text() -> None:
    parsed = parse_calls(HERMES, '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}'
                                 '</tool_call>')
    assert parsed.calls == (FoundCall("f", '{"a": 1}'),)


def _streamed(output: ToolOutput, text: str, step: int) -> tuple[dict[str, Any], str | None,
                                                                 list[dict[str, Any]]]:
    """The deltas of `text` fed `step` characters at a time, accumulated as the openai SDK
    does, the finish reason, and the raw deltas."""
    stream = output.stream()
    deltas: list[tuple[dict[str, Any], str | None]] = []
    for i in range(0, len(text), step):
        deltas += stream.feed(text[i:i + step], None)
    deltas += stream.feed("", "stop")
    content, calls = "", {}
    for body, _ in deltas:
        content += body.get("content", "")
        for call in body.get("tool_calls", []):
            slot = calls.setdefault(call["index"], {"id": None, "name": "", "arguments": ""})
            slot["id"] = call.get("id") or slot["id"]
            function = call.get("function", {})
            slot["name"] += function.get("name", "")
            slot["arguments"] += function.get("arguments", "")
    message = {"content": content or None, "calls": [calls[i] for i in sorted(calls)]}
    return message, deltas[-1][1], [b for b, _ in deltas]


@pytest.mark.parametrize("step", [1, 3, 1000])
@pytest.mark.parametrize(("fmt", "text", "content", "calls"), SAMPLES)
def test_streamed_deltas_add_up_to_the_whole(fmt: Any, text: str, content: str | None,
                                            calls: tuple[FoundCall, ...], step: int) -> None:
    output = ToolOutput(fmt)
    message, finish, deltas = _streamed(output, text, step)
    whole, whole_finish = output.message(text, "stop")
    assert finish == whole_finish == ("tool_calls" if calls else "stop")
    assert message["content"] == whole["content"]
    got = [(c["name"], c["arguments"]) for c in message["calls"]]
    assert got == [(c["function"]["name"], c["function"]["arguments"])
                   for c in whole.get("tool_calls", [])]
    assert all(c["id"].startswith("call_") for c in message["calls"])
    heads = [d["tool_calls"][0] for d in deltas if "tool_calls" in d and
             "id" in d["tool_calls"][0]]
    assert all(h["function"]["arguments"] == "" and h["type"] == "function" for h in heads)


def test_text_is_streamed_before_the_calls_and_held_after_a_marker() -> None:
    stream = ToolOutput(HERMES).stream()
    assert stream.feed("Hello <tool", None) == [({"content": "Hello "}, None)]
    assert stream.feed("_call>{\"name\": \"get_weather\", ", None) == []
    out = stream.feed('"arguments": {"city": "Paris"}}</tool_call>', None)
    assert [list(b["tool_calls"][0]) for b, _ in out] == [["index", "id", "type", "function"],
                                                          ["index", "function"]]
    assert json.loads(out[1][0]["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}


def test_a_lone_angle_bracket_is_content_once_it_cannot_be_a_marker() -> None:
    stream = ToolOutput(HERMES).stream()
    assert stream.feed("a <", None) == [({"content": "a "}, None)]
    assert stream.feed("b", None) == [({"content": "<b"}, None)]


def test_parallel_false_keeps_the_first_call() -> None:
    text = SAMPLES[1][1]
    output = ToolOutput(HERMES, parallel=False)
    whole, _ = output.message(text, "stop")
    assert [c["function"]["name"] for c in whole["tool_calls"]] == ["get_weather"]
    message, _, _ = _streamed(output, text, 2)
    assert [c["name"] for c in message["calls"]] == ["get_weather"]


def test_length_stays_length() -> None:
    whole, finish = ToolOutput(HERMES).message(SAMPLES[0][1], "length")
    assert finish == "length" and whole["tool_calls"]
