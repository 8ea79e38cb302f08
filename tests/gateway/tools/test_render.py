"""Conversations with tools through a tool-capable chat template and the generic prompt;
the format picked from the template, the vocabulary or the config."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerBase

from gateway.config import ConfigError, ModelSettings
from gateway.engine import Engine, load_tokenizer
from gateway.prompts import tokenize_chat
from gateway.protocol import parse_chat
from gateway.tools.formats import detect_format, resolve_format, template_supports_tools
from gateway.tools.types import offered_tools
from tests.gateway.harness import EngineFactory

# A Qwen2.5-style template: tools in the system turn, calls and results in Hermes tags.
TOOL_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTOOLS:{% for t in tools %}"
    "\n{{ t | tojson }}{% endfor %}<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n"
    "{{ m.content }}{% for c in m.tool_calls %}<tool_call>"
    "{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}"
    "</tool_call>{% endfor %}<|im_end|>\n"
    "{%- elif m.role == 'tool' %}<|im_start|>user\n<tool_response>[{{ m.tool_call_id }}] "
    "{{ m.content }}</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}}}}}
MESSAGES = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "22 C"}]


@pytest.fixture(scope="module")
def tool_tokenizer(tiny_model_dir: Path) -> PreTrainedTokenizerBase:
    tokenizer = load_tokenizer(tiny_model_dir)
    tokenizer.chat_template = TOOL_TEMPLATE
    return tokenizer


def _render(engine: Engine, **body: object) -> str:
    chat = parse_chat({"messages": MESSAGES, **body})
    ids = tokenize_chat(engine, chat.messages, tools=offered_tools(chat.tools))
    return str(engine.tokenizer.decode(ids))


def test_a_tool_template_renders_tools_calls_and_results(
        make_engine: EngineFactory, tool_tokenizer: PreTrainedTokenizerBase) -> None:
    engine = EngineFactory(tool_tokenizer, make_engine.word_ids)()
    text = _render(engine, tools=[WEATHER])
    assert "TOOLS:" + json.dumps(WEATHER) in text
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>' \
        in text
    assert "<tool_response>[call_1] 22 C</tool_response>" in text
    assert text.endswith("<|im_start|>assistant")
    assert "TOOLS:" not in _render(engine, tools=[WEATHER], tool_choice="none")


def test_a_template_without_tools_gets_the_generic_prompt(make_engine: EngineFactory) -> None:
    engine = make_engine()
    assert not template_supports_tools(engine.tokenizer)
    text = _render(engine, tools=[WEATHER])
    assert text.startswith("<|im_start|>system\n# Tools\n")
    assert "<tools>\n" + json.dumps(WEATHER) + "\n</tools>" in text
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
            '{"city": "Paris"}}\n</tool_call><|im_end|>') in text
    assert "<|im_start|>user\n<tool_response>\n22 C\n</tool_response><|im_end|>" in text
    none = _render(engine, tools=[WEATHER], tool_choice="none")
    assert "# Tools" not in none and "<tool_response>\n22 C" in none


def test_system_prompt_gets_the_tools_appended(make_engine: EngineFactory) -> None:
    engine = make_engine()
    chat = parse_chat({"messages": [{"role": "developer", "content": "Be brief."}, *MESSAGES],
                       "tools": [WEATHER]})
    text = str(engine.tokenizer.decode(tokenize_chat(engine, chat.messages,
                                                     tools=offered_tools(chat.tools))))
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert text.count("<|im_start|>system") == 1


def test_format_detection(tiny_model_dir: Path, tool_tokenizer: PreTrainedTokenizerBase
                          ) -> None:
    plain = load_tokenizer(tiny_model_dir)
    assert detect_format(plain, "llama") == "hermes"  # no tools in the template: generic
    assert detect_format(tool_tokenizer) == "hermes"
    mistral = copy.deepcopy(tool_tokenizer)
    mistral.chat_template = TOOL_TEMPLATE.replace("<tool_call>", "[TOOL_CALLS]")
    assert detect_format(mistral) == "mistral"
    llama = copy.deepcopy(tool_tokenizer)
    llama.chat_template = "{{ tools }}{% for m in messages %}{{ m.content }}{% endfor %}"
    assert detect_format(llama, "llama") == "llama3_json"
    llama.add_special_tokens({"additional_special_tokens": ["<|python_tag|>"]})
    assert detect_format(llama) == "llama3_json"
    assert resolve_format(plain, "mistral").name == "mistral"


def test_tool_parser_setting() -> None:
    assert ModelSettings().tool_parser == "auto"
    assert ModelSettings(tool_parser="llama3_json").tool_parser == "llama3_json"
    with pytest.raises(ConfigError, match="model.tool_parser"):
        ModelSettings(tool_parser="pythonic")


def test_cli_flag_sets_the_parser() -> None:
    from gateway.__main__ import build_parser, config_from_args
    args = build_parser().parse_args(["serve", "--tool-parser", "mistral"])
    assert config_from_args(args).model.tool_parser == "mistral"
    assert dataclasses.fields(ModelSettings)  # the tree stays frozen dataclasses
