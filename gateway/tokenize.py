"""vLLM's `/tokenize`, `/detokenize` and `/version`: the served model's tokenizer over HTTP.

Bodies and answers are vLLM's. `/tokenize` takes either a `prompt` (text, encoded as
/v1/completions encodes it) or chat `messages` (rendered by the chat template as
/v1/chat/completions renders them). Both tokenizer endpoints take a tenant's key as
/v1/ does, and a `model`, when sent, must name the served model. Neither checks the
context length (as vLLM). `/version` is open, as `/health` and `/openapi.json` are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.engine import Engine
from gateway.errors import invalid
from gateway.fields import Fields, type_error
from gateway.prompts import encode, tokenize_chat
from gateway.protocol import ChatMessage, parse_json, parse_messages
from gateway.responses import json_response
from gateway.served import resolve_model
from gateway.state import state_of
from gateway.tenants import authenticate
from gateway.version import package_version

router = APIRouter()

# vLLM's chat-form fields this server does not implement, with their harmless values
_UNSUPPORTED_CHAT = {"tools": lambda v: not v, "chat_template": lambda v: v is None,
                     "chat_template_kwargs": lambda v: not v,
                     "mm_processor_kwargs": lambda v: v is None}


@dataclass(frozen=True, slots=True)
class TokenizeBody:
    """A validated /tokenize request: a text `prompt`, or chat `messages` (then non-empty)."""

    model: str | None  # None: the served model
    return_token_strs: bool
    add_special_tokens: bool  # default True for a prompt, False for messages (vLLM's)
    prompt: str | None = None  # None: the chat form
    messages: tuple[ChatMessage, ...] = ()
    add_generation_prompt: bool = True  # chat form only, as the two below
    continue_final_message: bool = False


@dataclass(frozen=True, slots=True)
class DetokenizeBody:
    """A validated /detokenize request (ids not yet checked against the vocabulary)."""

    model: str | None
    tokens: tuple[int, ...]


def parse_tokenize(body: dict[str, Any]) -> TokenizeBody:
    """Validate a /tokenize body (400 naming the param on any problem)."""
    fields = Fields(body)
    model, strs = fields.str_("model"), fields.bool_("return_token_strs", False)
    prompt, messages = body.get("prompt"), body.get("messages")
    if prompt is not None and messages is not None:
        raise invalid("messages", "Send either 'prompt' or 'messages', not both.")
    if messages is None:
        if prompt is None:
            raise invalid("prompt", "'prompt' (a string) or 'messages' (a chat) is required.",
                          code="missing_required_parameter")
        if not isinstance(prompt, str):
            raise type_error("prompt", "a string", prompt)
        return TokenizeBody(model, strs, fields.bool_("add_special_tokens", True), prompt)
    fields.reject_unsupported(_UNSUPPORTED_CHAT)
    generation = fields.bool_("add_generation_prompt", True)
    continue_final = fields.bool_("continue_final_message", False)
    if generation and continue_final:
        raise invalid("continue_final_message", "Cannot set both 'continue_final_message' "
                                                "and 'add_generation_prompt' to true.")
    return TokenizeBody(model, strs, fields.bool_("add_special_tokens", False),
                        messages=parse_messages(messages), add_generation_prompt=generation,
                        continue_final_message=continue_final)


def parse_detokenize(body: dict[str, Any]) -> DetokenizeBody:
    """Validate a /detokenize body (400 naming the param on any problem)."""
    if body.get("tokens") is None:
        raise invalid("tokens", "'tokens' is required.", code="missing_required_parameter")
    fields = Fields(body)
    return DetokenizeBody(fields.str_("model"), fields.int_list("tokens"))


def token_ids(engine: Engine, body: TokenizeBody) -> list[int]:
    """The ids the request's prompt or chat tokenizes to, as the /v1/ endpoints make them."""
    if body.prompt is not None:
        return encode(engine.tokenizer, body.prompt, body.add_special_tokens)
    return tokenize_chat(engine, body.messages, add_generation_prompt=body.add_generation_prompt,
                         continue_final_message=body.continue_final_message,
                         add_special_tokens=body.add_special_tokens)


def detokenize(engine: Engine, tokens: tuple[int, ...]) -> str:
    """The text of `tokens`, special tokens included (as vLLM); 400 for an id past the vocab."""
    bad = [t for t in tokens if t >= engine.vocab_size]
    if bad:
        raise invalid("tokens", f"Token id {bad[0]} in 'tokens' is out of the model's "
                                f"vocabulary (size {engine.vocab_size}).")
    return str(engine.tokenizer.decode(list(tokens)))


@router.post("/tokenize")
async def tokenize(request: Request) -> Response:
    state = state_of(request)
    tenant = authenticate(state.tenants.current, request.headers.get("authorization"))
    body = parse_tokenize(parse_json(await request.body()))
    # NOTE: each base model tokenizes with its own tokenizer; adapters share their base's
    engine = state.engine.of(resolve_model(state.engine, tenant, body.model).base)
    ids = token_ids(engine, body)
    strs = engine.tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs else None
    return json_response({"count": len(ids), "max_model_len": engine.max_model_len,
                          "tokens": ids, "token_strs": strs})


@router.post("/detokenize")
async def detokenize_tokens(request: Request) -> Response:
    state = state_of(request)
    tenant = authenticate(state.tenants.current, request.headers.get("authorization"))
    body = parse_detokenize(parse_json(await request.body()))
    engine = state.engine.of(resolve_model(state.engine, tenant, body.model).base)
    return json_response({"prompt": detokenize(engine, body.tokens)})


@router.get("/version")
async def version() -> Response:
    return json_response({"version": package_version()})
