"""OpenAI request bodies for /v1/completions and /v1/chat/completions, validated.

Validation is ours (never FastAPI's 422): a wrong type, a value out of range, a
missing or empty prompt is a 400 naming the param; a known OpenAI/vLLM field
this server does not implement (the legacy functions / function_call, best_of
other than n, vLLM's prompt_logprobs, ...) is a 400 with code
`unsupported_parameter`; unknown fields are ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import orjson

from gateway.errors import clip, invalid, unsupported
from gateway.fields import Fields, is_int, is_number, range_error, type_error
from gateway.speculation import parse_request
from gateway.structured import Structured, for_tools, parse_structured
from gateway.tenants import SERVICE_TIERS
from gateway.tools.request import parse_tool_calls, parse_tool_request
from gateway.tools.types import ToolCall, ToolRequest
from models.sampling_params import MAX_LOGIT_BIAS, MAX_LOGPROBS, MAX_PENALTY
from models.spec_config import SpecConfig

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_N = 16  # choices per prompt (`n`); vLLM has no cap, each choice is a request here
MAX_CACHE_SALT_CHARS = 256  # vLLM has no cap; its docs suggest 43 (256 random bits, base64)


@dataclass(frozen=True, slots=True)
class GenerationOptions:
    """The fields both endpoints share, validated; defaults as OpenAI/vLLM.

    Sampling fields the client left out stay None, so that the served model's
    recommended defaults (`SamplingDefaults`) can fill them.
    """

    model: str | None = None  # None: the served model
    max_tokens: int | None = None  # None: the server's default (gateway.sampling_defaults)
    temperature: float | None = None  # None here and below: the server's default
    top_p: float | None = None
    top_k: int | None = None  # 0 = off (vLLM's -1 is accepted and means off)
    seed: int | None = None
    min_tokens: int = 0
    presence_penalty: float = 0.0  # in [-2, 2], over the generated tokens
    frequency_penalty: float = 0.0  # in [-2, 2], per occurrence among the generated tokens
    repetition_penalty: float | None = None  # > 0, over prompt and generated tokens; 1 = off
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias in [-100, 100]), sorted;
    # the ids are checked against the model's vocabulary at admission
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()  # matched on detokenized text
    stop_token_ids: tuple[int, ...] = ()  # vLLM extra, added to the EOS ids
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage
    priority: int | None = None  # vLLM-style: lower runs first
    service_tier: str | None = None
    user: str | None = None
    structured: Structured | None = None  # response_format / structured_outputs / guided_*
    logprobs: int | None = None  # alternatives per generated token, 0..20; None = no logprobs
    echo: bool = False  # completions: the prompt's text (and its logprobs) before the output
    n: int = 1  # choices per prompt, 1..MAX_N
    # vLLM's `cache_salt`: only requests with the same salt (of the same tenant, unless both
    # tenants share the pool) hit each other's prefix-cache blocks; None = the tenant's own
    cache_salt: str | None = None
    # prompt-lookup drafting (gateway/speculation.py): a config, False (off), True (the
    # tenant's or server's); None = not said
    speculative: SpecConfig | bool | None = None


Prompt = str | tuple[int, ...]  # text, or token ids


@dataclass(frozen=True, slots=True)
class CompletionBody:
    """A /v1/completions request: `options.n` choices per prompt."""

    options: GenerationOptions
    prompts: tuple[Prompt, ...]
    suffix: str | None = None  # fill-in-the-middle: the text after the completion


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One chat message, normalized to plain text."""

    role: str  # one of CHAT_ROLES
    content: str  # text parts joined with newlines
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant's calls (its content may be "")
    tool_call_id: str | None = None  # a "tool" message: the call it answers


@dataclass(frozen=True, slots=True)
class ChatBody:
    """A /v1/chat/completions request."""

    options: GenerationOptions
    messages: tuple[ChatMessage, ...]
    tools: ToolRequest | None = None  # None: no tools sent


def parse_json(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object; 400 when it is not one."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise invalid(None, f"We could not parse the JSON body of your request: {exc}. "
                            "The body must be a JSON object.", code="invalid_json") from None
    if not isinstance(body, dict):
        raise invalid(None, "The request body must be a JSON object.", code="invalid_json")
    return body


def _null(value: Any) -> bool:
    return value is None


def _falsy(value: Any) -> bool:
    return not value


def _no_tool_choice(value: Any) -> bool:
    return value in ("none", "auto")


_UNSUPPORTED_COMMON: dict[str, Callable[[Any], bool]] = {
    "use_beam_search": _falsy, "prompt_logprobs": _null,
}
_UNSUPPORTED_CHAT: dict[str, Callable[[Any], bool]] = {
    "functions": _falsy, "function_call": _no_tool_choice,
    "audio": _null, "modalities": lambda v: v == ["text"], "prediction": _null,
    "web_search_options": _null, "reasoning_effort": _null,
}


def _choices(fields: Fields) -> int:
    """`n` (1..MAX_N); `best_of` is taken only where it is trivial, equal to `n`."""
    n = fields.int_("n", 1, minimum=1, maximum=MAX_N) or 1
    if (best_of := fields.int_("best_of", n, minimum=1)) != n:
        raise unsupported("best_of", f"only best_of equal to n ({n}) is implemented, "
                                     f"got {best_of}")
    return n


def _cache_salt(fields: Fields) -> str | None:
    """vLLM's `cache_salt`: a non-empty string of at most MAX_CACHE_SALT_CHARS."""
    salt, param = fields.str_("cache_salt"), fields.name("cache_salt")
    if salt is None:
        return None
    if not salt:
        raise invalid(param, f"Invalid '{param}': expected a non-empty string, but got an "
                             "empty string instead.", code="invalid_value")
    if len(salt) > MAX_CACHE_SALT_CHARS:
        raise range_error(param, f"of at most {MAX_CACHE_SALT_CHARS} characters", salt)
    return salt


def _logit_bias(fields: Fields) -> tuple[tuple[int, float], ...]:
    """OpenAI `logit_bias`: an object of token ids (as strings) -> bias in [-100, 100]."""
    value, param = fields.raw("logit_bias"), fields.name("logit_bias")
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise type_error(param, "an object mapping token ids to numbers", value)
    bias: dict[int, float] = {}
    for key, b in value.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit()):
            raise invalid(param, f"Invalid key in '{param}': {clip(key)}. Keys must be "
                                 "non-negative integer token ids.", code="invalid_value")
        if not is_number(b):
            raise type_error(param, "numbers as values", b)
        if not -MAX_LOGIT_BIAS <= b <= MAX_LOGIT_BIAS:
            raise invalid(param, f"Invalid value for key {key} in '{param}': {clip(b)}. "
                                 f"Values must be in [-{MAX_LOGIT_BIAS:g}, "
                                 f"{MAX_LOGIT_BIAS:g}].", code="invalid_value")
        bias[int(key)] = float(b)
    return tuple(sorted(bias.items()))


def _chat_logprobs(fields: Fields) -> int | None:
    """Chat's `logprobs` (a boolean) and `top_logprobs` (0..20, only with it), as one count."""
    top = fields.int_("top_logprobs", None, minimum=0, maximum=MAX_LOGPROBS)
    if not fields.bool_("logprobs", False):
        if top is not None:
            raise invalid("top_logprobs", "'top_logprobs' requires 'logprobs' to be true.")
        return None
    return top or 0


def _completion_logprobs(fields: Fields, suffix: str | None) -> tuple[int | None, bool]:
    """Completions' `logprobs` (0..20: vLLM's cap, OpenAI's is 5) and `echo`."""
    logprobs = fields.int_("logprobs", None, minimum=0, maximum=MAX_LOGPROBS)
    echo = fields.bool_("echo", False)
    if echo and suffix is not None:
        raise unsupported("echo", "not with 'suffix'")
    return logprobs, echo


def _options(fields: Fields, max_tokens: int | None) -> GenerationOptions:
    stream = fields.bool_("stream", False)
    stream_options = fields.obj("stream_options")
    if stream_options is not None and not stream:
        raise invalid("stream_options", "'stream_options' is only allowed when 'stream' is true.")
    top_k = fields.int_("top_k", None, minimum=-1)
    return GenerationOptions(
        model=fields.str_("model"),
        max_tokens=max_tokens,
        temperature=fields.optional_float("temperature", minimum=0.0),
        top_p=fields.optional_float("top_p", maximum=1.0, above=0.0),
        top_k=None if top_k is None else max(top_k, 0),
        seed=fields.int_("seed", None),
        min_tokens=fields.int_("min_tokens", 0, minimum=0) or 0,
        presence_penalty=fields.float_("presence_penalty", 0.0, -MAX_PENALTY, MAX_PENALTY),
        frequency_penalty=fields.float_("frequency_penalty", 0.0, -MAX_PENALTY, MAX_PENALTY),
        repetition_penalty=fields.optional_float("repetition_penalty", above=0.0),
        logit_bias=_logit_bias(fields),
        ignore_eos=fields.bool_("ignore_eos", False),
        stop=fields.stop(),
        stop_token_ids=fields.int_list("stop_token_ids"),
        stream=stream,
        include_usage=stream_options.bool_("include_usage", False) if stream_options else False,
        priority=fields.int_("priority", None),
        service_tier=fields.str_("service_tier", None, choices=SERVICE_TIERS),
        user=fields.str_("user"),
        structured=parse_structured(fields),
        n=_choices(fields),
        cache_salt=_cache_salt(fields),
        speculative=parse_request(fields),
    )


def _check_min_tokens(options: GenerationOptions) -> None:
    if options.max_tokens is not None and options.min_tokens > options.max_tokens:
        raise range_error("min_tokens", f"<= max_tokens ({options.max_tokens})",
                          options.min_tokens)


def parse_completion(body: dict[str, Any], max_prompts: int) -> CompletionBody:
    """Validate a /v1/completions body (400 ApiError on any problem)."""
    fields = Fields(body)
    fields.reject_unsupported(_UNSUPPORTED_COMMON)
    options = _options(fields, fields.int_("max_tokens", None, minimum=1))
    _check_min_tokens(options)
    # NOTE: "" means no suffix, as null does; with one, an empty prompt is an empty prefix
    suffix = fields.str_("suffix") or None
    logprobs, echo = _completion_logprobs(fields, suffix)
    options = replace(options, logprobs=logprobs, echo=echo)
    return CompletionBody(options, _prompts(body.get("prompt"), max_prompts,
                                            empty_text=suffix is not None), suffix)


def parse_chat(body: dict[str, Any]) -> ChatBody:
    """Validate a /v1/chat/completions body (400 ApiError on any problem)."""
    fields = Fields(body)
    fields.reject_unsupported({**_UNSUPPORTED_COMMON, **_UNSUPPORTED_CHAT})
    # NOTE: max_completion_tokens supersedes the deprecated max_tokens, as in OpenAI.
    max_tokens = fields.int_("max_tokens", None, minimum=1)
    max_tokens = fields.int_("max_completion_tokens", max_tokens, minimum=1)
    options = replace(_options(fields, max_tokens), logprobs=_chat_logprobs(fields))
    _check_min_tokens(options)
    tools = parse_tool_request(body)
    if tools is not None and tools.forced:
        options = replace(options, structured=for_tools(tools, options.structured))
    return ChatBody(options, parse_messages(body.get("messages")), tools)


def _token_ids(value: list[Any], param: str) -> tuple[int, ...]:
    if not value:
        raise invalid(param, f"'{param}' must not be empty.", code="empty_prompt")
    if not all(is_int(v) and v >= 0 for v in value):
        raise type_error(param, "an array of non-negative integer token ids", value)
    return tuple(value)


def _prompts(value: Any, max_prompts: int, empty_text: bool = False) -> tuple[Prompt, ...]:
    if value is None:
        raise invalid("prompt", "'prompt' is required.", code="missing_required_parameter")
    if isinstance(value, str):
        value = [value]
    elif isinstance(value, list) and value and all(is_int(v) for v in value):
        return (_token_ids(value, "prompt"),)
    if isinstance(value, list) and not value:
        raise invalid("prompt", "'prompt' must not be empty.", code="empty_prompt")
    if not isinstance(value, list) or any(is_int(v) for v in value):
        raise type_error("prompt", "a string, an array of strings, an array of token ids or "
                                   "an array of token id arrays", value)
    if len(value) > max_prompts:
        raise invalid("prompt", f"At most {max_prompts} prompts per request, got {len(value)}.")
    prompts: list[Prompt] = []
    for i, item in enumerate(value):
        param = f"prompt[{i}]" if len(value) > 1 else "prompt"
        if isinstance(item, str):
            if not item and not empty_text:
                raise invalid(param, f"'{param}' must not be empty.", code="empty_prompt")
            prompts.append(item)
        elif isinstance(item, list):
            prompts.append(_token_ids(item, param))
        else:
            raise type_error(param, "a string or an array of token ids", item)
    return tuple(prompts)


def parse_messages(value: Any) -> tuple[ChatMessage, ...]:
    """Validate chat `messages` (400 naming `messages` or `messages[i]...` on any problem)."""
    if value is None:
        raise invalid("messages", "'messages' is required.", code="missing_required_parameter")
    if not isinstance(value, list):
        raise type_error("messages", "an array of messages", value)
    if not value:
        raise invalid("messages", "'messages' must contain at least one message.",
                      code="empty_array")
    return tuple(_message(m, f"messages[{i}]") for i, m in enumerate(value))


def _message(value: Any, param: str) -> ChatMessage:
    if not isinstance(value, dict):
        raise type_error(param, "an object", value)
    role = value.get("role")
    if role == "function":
        raise unsupported(f"{param}.role", "the legacy 'function' role; use 'tool'")
    if not isinstance(role, str):
        raise type_error(f"{param}.role", "a string", role)
    if role not in CHAT_ROLES:
        raise range_error(f"{param}.role", f"in {', '.join(CHAT_ROLES)}", role)
    calls = parse_tool_calls(value.get("tool_calls"), f"{param}.tool_calls")
    if calls and role != "assistant":
        raise invalid(f"{param}.tool_calls", "Only assistant messages may have 'tool_calls'.")
    content = value.get("content")
    if content is None and role == "assistant":
        content = ""
    return ChatMessage(role, _content(content, f"{param}.content"), calls,
                       _tool_call_id(value, role, param))


def _tool_call_id(value: dict[str, Any], role: str, param: str) -> str | None:
    call_id = value.get("tool_call_id")
    if role != "tool":
        return None
    if not isinstance(call_id, str) or not call_id:
        raise invalid(f"{param}.tool_call_id", f"'{param}.tool_call_id' is required in a "
                                               "'tool' message and must be a string.",
                      code="missing_required_parameter")
    return call_id


def _content(value: Any, param: str) -> str:
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise type_error(param, "a string or an array of content parts", value)
    texts = []
    for j, part in enumerate(value):
        if not isinstance(part, dict):
            raise type_error(f"{param}[{j}]", "an object", part)
        if part.get("type") != "text":
            raise unsupported(f"{param}[{j}].type", "only text content parts are implemented")
        text = part.get("text")
        if not isinstance(text, str):
            raise type_error(f"{param}[{j}].text", "a string", text)
        texts.append(text)
    return "\n".join(texts)
