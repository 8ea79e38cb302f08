"""The tool-call formats of model families, as data, and picking a model's.

A format says how a model writes its calls after plain text::

    [text] trigger ... calls ... [text]

`section_open` is consumed once where the calls begin (Mistral's `[TOOL_CALLS]`, Llama's
optional `<|python_tag|>`), then `list_open`; each call is `call_open` JSON `call_close`,
calls are separated by `separator` (whitespace is free everywhere), and `list_close`
ends them. The JSON is `{name_key: ..., one of args_keys: {...}}`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

AUTO = "auto"


@dataclass(frozen=True, slots=True)
class CallFormat:
    """How one model family writes tool calls (see the module docstring)."""

    name: str
    triggers: tuple[str, ...]  # text whose appearance starts the calls
    at_start: bool = False  # True: calls only where the output begins (after whitespace)
    section_open: tuple[str, ...] = ()  # consumed once, if present, where the calls begin
    list_open: str = ""
    list_close: str = ""
    call_open: str = ""
    call_close: str = ""
    separator: str = ""
    args_keys: tuple[str, ...] = ("arguments", "parameters")
    signs: tuple[str, ...] = ()  # text in a chat template or vocabulary that marks the family


KNOWN_FORMATS: dict[str, CallFormat] = {
    # Hermes 2 Pro/3, Qwen2/2.5/3, and the generic prompt (gateway/tools/generic_prompt.py)
    "hermes": CallFormat("hermes", triggers=("<tool_call>",), call_open="<tool_call>",
                         call_close="</tool_call>", signs=("<tool_call>",)),
    # Llama 3.1/3.2/3.3's JSON tool calling: {"name": ..., "parameters": {...}}
    "llama3_json": CallFormat("llama3_json", triggers=("<|python_tag|>", "{"), at_start=True,
                              section_open=("<|python_tag|>",), separator=";",
                              signs=("<|python_tag|>",)),
    # Mistral 7B v0.3, Mixtral 8x22B, Mistral Nemo: [TOOL_CALLS][{...}, ...]
    "mistral": CallFormat("mistral", triggers=("[TOOL_CALLS]",),
                          section_open=("[TOOL_CALLS]",), list_open="[", list_close="]",
                          separator=",", signs=("[TOOL_CALLS]",)),
}
DEFAULT_FORMAT = "hermes"  # what the generic prompt asks for
MODEL_TYPES = {"qwen2": "hermes", "qwen3": "hermes", "llama": "llama3_json",
               "mistral": "mistral"}  # config.json model_type -> format, when signs are silent


def parse_tool_parser_setting(value: Any) -> str:
    """`model.tool_parser`: auto or a known format's name; ValueError otherwise."""
    if value == AUTO or value in KNOWN_FORMATS:
        return str(value)
    raise ValueError(f"{AUTO} or one of {', '.join(KNOWN_FORMATS)}, got {value!r}")


def template_source(tokenizer: PreTrainedTokenizerBase) -> str:
    """The chat template's text ("" without one); a dict of named templates, all of it."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, Mapping):
        return "\n".join(str(t) for t in template.values())
    return str(template)


def template_supports_tools(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the chat template renders `tools` itself (else the generic prompt does)."""
    return "tools" in template_source(tokenizer)


def detect_format(tokenizer: PreTrainedTokenizerBase, model_type: str | None = None) -> str:
    """The format a model writes: by the signs in its tool-capable chat template or its
    vocabulary, else by its model type; a template without tools gets the generic prompt,
    hence Hermes."""
    if not template_supports_tools(tokenizer):
        return DEFAULT_FORMAT
    text = template_source(tokenizer)
    vocab = tokenizer.get_vocab()
    for fmt in KNOWN_FORMATS.values():
        if any(sign in text or sign in vocab for sign in fmt.signs):
            return fmt.name
    return MODEL_TYPES.get(model_type or "", DEFAULT_FORMAT)


def resolve_format(tokenizer: PreTrainedTokenizerBase, setting: str,
                   model_type: str | None = None) -> CallFormat:
    """The format for `model.tool_parser`: the named one, or the detected one (auto)."""
    name = detect_format(tokenizer, model_type) if setting == AUTO else setting
    return KNOWN_FORMATS[name]
