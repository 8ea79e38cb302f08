"""Prompts to token ids (chat template, tokenizer) and the context-length rules."""

from __future__ import annotations

from collections.abc import Sequence

from jinja2 import TemplateError
from transformers import PreTrainedTokenizerBase

from gateway.engine import Engine
from gateway.errors import invalid
from gateway.fim import Fim, no_fim_message
from gateway.protocol import ChatMessage, GenerationOptions, Prompt
from gateway.tools.formats import template_supports_tools
from gateway.tools.render import conversation
from gateway.tools.types import Tool

DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's and vLLM's default for /v1/completions


def tokenize_completion(engine: Engine, prompts: tuple[Prompt, ...],
                        suffix: str | None = None) -> list[list[int]]:
    """Token ids of each prompt: text is encoded with special tokens (BOS), ids are checked.

    With a `suffix`, each prompt is the prefix of a fill-in-the-middle prompt framed by the
    model's FIM tokens (gateway/fim.py); 400 `unsupported_parameter` when it has none."""
    fim, suffix_ids = None, []
    if suffix is not None:
        fim = _fim_of(engine)
        suffix_ids = fim.encode_suffix(suffix)
    out = []
    for i, prompt in enumerate(prompts):
        param = f"prompt[{i}]" if len(prompts) > 1 else "prompt"
        if isinstance(prompt, str):
            ids = encode(engine.tokenizer, prompt, add_special_tokens=fim is None)
            if not ids and fim is None:
                raise invalid(param, f"'{param}' tokenizes to no tokens.", code="empty_prompt")
        else:
            ids = list(prompt)
            bad = [t for t in ids if t >= engine.vocab_size]
            if bad:
                raise invalid(param, f"Token id {bad[0]} in '{param}' is out of the model's "
                                     f"vocabulary (size {engine.vocab_size}).")
        out.append(ids if fim is None else fim.prompt(ids, suffix_ids))
    return out


def _fim_of(engine: Engine) -> Fim:
    if engine.fim is None:
        raise invalid("suffix", no_fim_message(engine.tokenizer, engine.vocab_size,
                                               engine.served_model_name),
                      code="unsupported_parameter")
    return engine.fim


def encode(tokenizer: PreTrainedTokenizerBase, text: str,
           add_special_tokens: bool = True) -> list[int]:
    """Token ids of `text`, with special tokens (BOS) unless told, as `tokenizer.encode` gives.

    NOTE: straight through a fast tokenizer's Rust backend where there is one: the same
    ids, without the batch call (a thread pool woken per prompt) that made a 16-token
    prompt cost ~0.25 ms in the server against ~0.02 ms here."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return list(backend.encode(text, add_special_tokens=add_special_tokens).ids)
    return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))


def tokenize_chat(engine: Engine, messages: tuple[ChatMessage, ...], *,
                  add_generation_prompt: bool = True, continue_final_message: bool = False,
                  add_special_tokens: bool = False, tools: Sequence[Tool] = ()) -> list[int]:
    """Token ids of the conversation rendered by the tokenizer's chat template.

    `tools` are those offered to the model (gateway/tools/render.py: the template's own
    tool rendering, else the generic prompt). The flags are vLLM's (its /tokenize sets
    them); chat completions use the defaults."""
    if not engine.has_chat_template:
        raise invalid("messages", f"Model {engine.served_model_name!r} has no chat template; "
                                  "use /v1/completions.", code="no_chat_template")
    chat, tool_defs = conversation(messages, tools,
                                   native=template_supports_tools(engine.tokenizer))
    try:
        text = engine.tokenizer.apply_chat_template(
            chat, tools=tool_defs, tokenize=False, add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message)
    except (TemplateError, ValueError) as exc:  # ValueError: continue_final_message's checks
        raise invalid("messages", f"The model's chat template rejected the messages: "
                                  f"{exc}") from None
    ids = list(engine.tokenizer.encode(str(text), add_special_tokens=add_special_tokens))
    if not ids:
        raise invalid("messages", "The messages render to an empty prompt.", code="empty_prompt")
    return ids


def resolve_max_tokens(options: GenerationOptions, num_prompt_tokens: int, max_model_len: int,
                       chat: bool, default: int | None = None, note: str = "") -> int:
    """The request's max_tokens: explicit, else `default` (the model's max_new_tokens), else
    the endpoint's (16 for completions, the rest of the context for chat); 400 past the context
    (`note`: why the context is what it is, `Engine.context_note`).
    """
    prompt_param = "messages" if chat else "prompt"
    room = max_model_len - num_prompt_tokens
    if room < 1:
        raise invalid(prompt_param, f"This model's maximum context length is {max_model_len} "
                                    f"tokens{note}. However, your prompt has {num_prompt_tokens} "
                                    "tokens, which leaves no room for a completion. Please "
                                    "shorten it.", code="context_length_exceeded")
    if options.max_tokens is None:
        endpoint_default = room if chat else DEFAULT_COMPLETION_MAX_TOKENS
        max_tokens = min(default or endpoint_default, room)
    elif options.max_tokens > room:
        raise invalid("max_tokens", f"This model's maximum context length is {max_model_len} "
                                    f"tokens{note}. However, you requested "
                                    f"{num_prompt_tokens + options.max_tokens} tokens "
                                    f"({num_prompt_tokens} in the {prompt_param}, "
                                    f"{options.max_tokens} in the completion). Please reduce "
                                    f"the length of the {prompt_param} or completion.",
                      code="context_length_exceeded")
    else:
        max_tokens = options.max_tokens
    if options.min_tokens > max_tokens:
        raise invalid("min_tokens", f"min_tokens ({options.min_tokens}) must not exceed "
                                    f"max_tokens ({max_tokens}).")
    return max_tokens
