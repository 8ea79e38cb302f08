"""JSON schemas of the OpenAPI document (gateway/openapi.py): request bodies and results.

Request schemas describe what the server accepts, as OpenAI's (protocol.py checks more:
value ranges against the model, known fields it does not implement); result schemas
what it answers. Objects allow more properties, as OpenAI's clients do.
"""

from __future__ import annotations

from typing import Any

from gateway.batches.types import COMPLETION_WINDOWS, ENDPOINTS
from gateway.protocol import MAX_CACHE_SALT_CHARS, MAX_N
from gateway.tenants import SERVICE_TIERS

S = dict[str, Any]
NULL: S = {"type": "null"}
STR: S = {"type": "string"}
INT: S = {"type": "integer"}
NUM: S = {"type": "number"}
BOOL: S = {"type": "boolean"}


def _nullable(schema: S) -> S:
    return {"anyOf": [schema, NULL]}


def _obj(required: tuple[str, ...] = (), **props: S) -> S:
    return {"type": "object", "required": list(required), "properties": props}


def _ref(name: str) -> S:
    return {"$ref": f"#/components/schemas/{name}"}


_SPEC: S = {**_obj(("num_speculative_tokens",), method={"enum": ["ngram"]},
                   num_speculative_tokens={"type": "integer", "minimum": 1, "maximum": 16},
                   prompt_lookup_max={"type": "integer", "minimum": 1, "maximum": 64},
                   prompt_lookup_min={"type": "integer", "minimum": 1, "maximum": 64}),
            "description": "vLLM's --speculative-config for prompt lookup (n-gram drafting)."}
_SCHEMA: S = {"anyOf": [{"type": "object"}, STR], "description": "A JSON schema (or its "
               "JSON text)."}
_CHOICES: S = {"type": "array", "items": STR, "minItems": 1}
_GRAMMAR: S = {"type": "string", "minLength": 1,
               "description": "A Lark or GBNF grammar (llguidance's)."}
_STRUCTURED: dict[str, S] = {  # one at most per request
    "response_format": {**_nullable({"anyOf": [
        _obj(("type",), type={"enum": ["text", "json_object"]}),
        _obj(("type", "json_schema"), type={"const": "json_schema"}, json_schema=_obj(
            ("schema",), name=STR, schema={"type": "object"}, strict=_nullable(BOOL)))]}),
        "description": "OpenAI's: the output is any JSON object, or one valid against the "
                       "schema."},
    "structured_outputs": {**_nullable(_obj(
        json=_SCHEMA, regex={"type": "string", "minLength": 1}, choice=_CHOICES,
        grammar=_GRAMMAR, json_object=_nullable({"const": True}))),
        "description": "vLLM's: one of json, regex, choice, grammar, json_object."},
    "guided_json": _nullable(_SCHEMA), "guided_regex": _nullable({"type": "string",
                                                                  "minLength": 1}),
    "guided_choice": _nullable(_CHOICES), "guided_grammar": _nullable(_GRAMMAR),
}
_STOP: S = _nullable({"anyOf": [STR, {"type": "array", "items": STR}]})
_OPTIONS: dict[str, S] = {  # what both generation endpoints accept
    "model": _nullable(STR),
    "max_tokens": _nullable({"type": "integer", "minimum": 1}),
    "temperature": _nullable({"type": "number", "minimum": 0}),
    "top_p": _nullable({"type": "number", "exclusiveMinimum": 0, "maximum": 1}),
    "top_k": _nullable({"type": "integer", "minimum": -1}),
    "seed": _nullable(INT),
    "stop": _STOP,
    "stop_token_ids": _nullable({"type": "array", "items": INT}),
    "min_tokens": _nullable({"type": "integer", "minimum": 0}),
    "presence_penalty": {**_nullable({"type": "number", "minimum": -2, "maximum": 2}),
                         "description": "Subtracted from the logit of every token already "
                                        "generated (OpenAI's); 0 = off."},
    "frequency_penalty": {**_nullable({"type": "number", "minimum": -2, "maximum": 2}),
                          "description": "Times its count, subtracted from the logit of every "
                                         "token already generated (OpenAI's); 0 = off."},
    "repetition_penalty": {**_nullable({"type": "number", "exclusiveMinimum": 0}),
                           "description": "Divides the positive and multiplies the negative "
                                          "logits of every prompt or generated token "
                                          "(transformers'); 1 = off; default: the model's "
                                          "generation_config, else 1."},
    "logit_bias": {**_nullable({
        "type": "object", "propertyNames": {"pattern": "^[0-9]+$"},
        "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100}}),
        "description": "Token id (a string, below the vocabulary size) -> bias added to its "
                       "logit; -100 bans a token, 100 forces it."},
    "ignore_eos": _nullable(BOOL),
    "stream": _nullable(BOOL),
    "stream_options": _nullable(_obj(include_usage=_nullable(BOOL))),
    "n": {**_nullable({"type": "integer", "minimum": 1, "maximum": MAX_N}),
          "description": "Choices per prompt, sampled independently (with a seed, choice j "
                         "uses seed + j); a list of prompts gets its choices prompt-major "
                         "(index = prompt index * n + j)."},
    "priority": _nullable(INT),
    "service_tier": _nullable({"enum": list(SERVICE_TIERS)}),
    "user": _nullable(STR),
    "cache_salt": {**_nullable({"type": "string", "minLength": 1,
                                  "maxLength": MAX_CACHE_SALT_CHARS}),
                   "description": "vLLM's: only requests with the same salt hit each other's "
                                  "prefix-cache blocks (within a tenant, or the shared pool "
                                  "of tenants with share_prefix_cache). Make it random and "
                                  "secret, e.g. 43 base64 characters."},
    "speculative": {"anyOf": [BOOL, _SPEC, {"type": "null"}],
                    "description": "slicegate's: prompt-lookup speculative decoding for this "
                                   "request: false (off), true (the tenant's or server's "
                                   "config) or a config; absent: the tenant's or server's "
                                   "(docs/speculation.md)."},
    **_STRUCTURED,
}
_TOKENS: S = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
_PROMPT: S = {"anyOf": [STR, {"type": "array", "items": STR, "minItems": 1}, _TOKENS,
                        {"type": "array", "items": _TOKENS, "minItems": 1}]}
_SUFFIX: S = {**_nullable(STR), "description": "Fill-in-the-middle: the text after the "
              "completion; the prompt is the text before it. Needs a model with FIM tokens "
              "(else 400 unsupported_parameter); \"\" means none."}
_LOGPROBS = "natural log under the raw model distribution (before bias, penalties, "\
    "temperature, top-k, top-p: vLLM's raw_logprobs)"
_COMPLETION_LOGPROBS: dict[str, S] = {
    "logprobs": {**_nullable({"type": "integer", "minimum": 0, "maximum": 20}),
                 "description": "Log-probs of each token and of this many alternatives (0..20, "
                                "vLLM's cap; OpenAI's is 5), " + _LOGPROBS + "."},
    "echo": {**_nullable(BOOL), "description": "The prompt's text before the completion; with "
             "logprobs, the prompt tokens' too (the first one's null). Not with suffix."},
}
_CHAT_LOGPROBS: dict[str, S] = {
    "logprobs": {**_nullable(BOOL), "description": "Log-probs of each output token, "
                 + _LOGPROBS + "."},
    "top_logprobs": {**_nullable({"type": "integer", "minimum": 0, "maximum": 20}),
                     "description": "Alternatives per token (needs logprobs: true)."},
}
_TOP: S = _obj(("token", "logprob", "bytes"), token=STR, logprob=NUM,
               bytes=_nullable({"type": "array", "items": INT}))
_CHAT_LOGPROB: S = _nullable(_obj(("content",), content=_nullable({"type": "array", "items": {
    **_TOP, "required": ["token", "logprob", "bytes", "top_logprobs"],
    "properties": {**_TOP["properties"], "top_logprobs": {"type": "array", "items": _TOP}}}})))
_COMPLETION_LOGPROB: S = _nullable(_obj(
    ("tokens", "token_logprobs", "top_logprobs", "text_offset"),
    tokens={"type": "array", "items": STR},
    token_logprobs={"type": "array", "items": _nullable(NUM)},
    top_logprobs={"type": "array", "items": _nullable({"type": "object",
                                                        "additionalProperties": NUM})},
    text_offset={"type": "array", "items": INT}))
_TEXT_PART: S = _obj(("type", "text"), type={"const": "text"}, text=STR)
_FUNCTION_NAME: S = {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"}
_CALL: S = _obj(("id", "type", "function"), id={"type": "string", "minLength": 1},
                type={"const": "function"},
                function=_obj(("name", "arguments"), name={"type": "string", "minLength": 1},
                              arguments=STR))
_MESSAGE: S = _obj(("role",), role={"enum": ["system", "developer", "user", "assistant",
                                             "tool"]},
                   content=_nullable({"anyOf": [STR, {"type": "array", "items": _TEXT_PART}]}),
                   name=STR, tool_calls={**_nullable({"type": "array", "items": _CALL}),
                                         "description": "An assistant message's calls."},
                   tool_call_id={**STR, "description": "A tool message's call (required)."})
_TOOLS: dict[str, S] = {
    "tools": {**_nullable({"type": "array", "items": _obj(
        ("type", "function"), type={"const": "function"}, function=_obj(
            ("name",), name=_FUNCTION_NAME, description=_nullable(STR),
            parameters=_nullable({"type": "object"}), strict=_nullable(BOOL)))}),
        "description": "Functions the model may call; see docs/api.md, Tools."},
    "tool_choice": {**_nullable({"anyOf": [
        {"enum": ["none", "auto", "required"]},
        _obj(("type", "function"), type={"const": "function"},
             function=_obj(("name",), name=_FUNCTION_NAME))]}),
        "description": "none | auto (the default with tools); required and a named function "
                       "are 400 unsupported_parameter until structured output lands."},
    "parallel_tool_calls": {**_nullable(BOOL),
                            "description": "false: only the first call is returned."},
}
_USAGE: S = _obj(("prompt_tokens", "completion_tokens", "total_tokens"), prompt_tokens=INT,
                 completion_tokens=INT, total_tokens=INT)
_FINISH: S = _nullable({"enum": ["stop", "length", "abort", "error", "tool_calls"]})
_BASE = ("id", "object", "created", "model", "choices")


def _result(obj: str, choice: S) -> S:
    return _obj((*_BASE, "usage"), id=STR, object={"const": obj}, created=INT, model=STR,
                choices={"type": "array", "items": choice}, usage=_USAGE)


_FILE: S = _obj(("id", "object", "bytes", "created_at", "filename", "purpose"), id=STR,
                object={"const": "file"}, bytes=INT, created_at=INT,
                expires_at=_nullable(INT), filename=STR, purpose=STR, status=STR)
_BATCH: S = _obj(("id", "object", "endpoint", "input_file_id", "completion_window", "status",
                  "created_at", "request_counts"),
                 id=STR, object={"const": "batch"}, endpoint=STR, input_file_id=STR,
                 completion_window=STR, status=STR, created_at=INT,
                 output_file_id=_nullable(STR), error_file_id=_nullable(STR),
                 request_counts=_obj(("total", "completed", "failed"), total=INT,
                                     completed=INT, failed=INT),
                 metadata=_nullable({"type": "object", "additionalProperties": STR}))


def _page(item: S) -> S:
    return _obj(("object", "data"), object={"const": "list"},
                data={"type": "array", "items": item}, first_id=_nullable(STR),
                last_id=_nullable(STR), has_more=BOOL)


_POSITIVE: S = _nullable({"type": "integer", "minimum": 1})
_BUDGET: S = _obj((), daily_tokens=_POSITIVE, monthly_tokens=_POSITIVE,
                  prompt_weight=_nullable({"type": "number", "exclusiveMinimum": 0}),
                  completion_weight=_nullable({"type": "number", "exclusiveMinimum": 0}))
_TENANT_FIELDS: S = {"priority": _nullable({"enum": ["high", "normal", "low"]}),
                     "ttft_slo_ms": _nullable({"type": "number", "exclusiveMinimum": 0}),
                     "tpot_slo_ms": _nullable({"type": "number", "exclusiveMinimum": 0}),
                     "max_concurrency": _POSITIVE, "requests_per_minute": _POSITIVE,
                     "tokens_per_minute": _POSITIVE, "share_prefix_cache": BOOL,
                     "budget": _nullable(_BUDGET),
                     "models": _nullable({"type": "array",
                                          "items": {"type": "string", "minLength": 1}}),
                     "default_model": _nullable({"type": "string", "minLength": 1}),
                     "speculative_config": {"anyOf": [{"const": False}, _SPEC,
                                                      {"type": "null"}]}}
_KEYS: S = {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1}
_TENANT_KEY: S = _obj(("object", "id", "tenant", "source"), object={"const": "tenant.key"},
                      id=STR, tenant=STR, source={"enum": ["file", "admin"]},
                      created_at=_nullable(INT), created_by=_nullable(STR),
                      api_key={"type": "string", "description": "Only when the server made "
                                                                "the key, this once."})
_TENANT: S = _obj(("object", "name", "source", "keys"), object={"const": "tenant"}, name=STR,
                  source={"enum": ["file", "admin"]},
                  keys={"type": "array", "items": _TENANT_KEY}, api_key=STR,
                  **_TENANT_FIELDS)
_WINDOW: S = _obj(("period", "spent_tokens", "reserved_tokens", "limit_tokens",
                   "remaining_tokens", "resets_at"), period=STR, spent_tokens=INT,
                  reserved_tokens=INT, limit_tokens=_nullable(INT),
                  remaining_tokens=_nullable(INT), resets_at=STR)
_TENANT_SCHEMAS: dict[str, S] = {
    "TenantCreate": _obj(("name",), name={"type": "string", "minLength": 1}, api_keys=_KEYS,
                         api_key_sha256=_KEYS, **_TENANT_FIELDS),
    "TenantUpdate": _obj((), **_TENANT_FIELDS),
    "Tenant": _TENANT,
    "TenantList": _obj(("object", "data"), object={"const": "list"},
                       data={"type": "array", "items": _TENANT}),
    "TenantDeleted": _obj(("object", "name", "deleted"), object={"const": "tenant.deleted"},
                          name=STR, deleted=BOOL),
    "TenantKeyCreate": _obj((), api_key={"type": "string", "minLength": 1},
                            api_key_sha256={"type": "string", "pattern": "^[0-9a-fA-F]{64}$"}),
    "TenantKey": _TENANT_KEY,
    "TenantKeyDeleted": _obj(("object", "id", "tenant", "deleted"),
                             object={"const": "tenant.key.deleted"}, id=STR, tenant=STR,
                             deleted=BOOL),
    "TenantsReload": _obj(("object", "added", "removed", "changed", "tenants"),
                          object={"const": "tenants.reload"},
                          added={"type": "array", "items": STR},
                          removed={"type": "array", "items": STR},
                          changed={"type": "array", "items": STR}, tenants=INT, file=STR),
    "TenantUsage": _obj(("object", "tenant", "budget", "daily", "monthly"),
                        object={"const": "tenant.usage"}, tenant=STR,
                        budget=_nullable(_BUDGET), daily=_WINDOW, monthly=_WINDOW),
    "AuditLog": _obj(("object", "data", "has_more"), object={"const": "list"},
                     data={"type": "array", "items": _obj(
                         ("seq", "at", "actor", "action", "tenant", "detail"), seq=INT, at=NUM,
                         actor=STR, action=STR, tenant=_nullable(STR),
                         detail={"type": "object"})}, has_more=BOOL),
}

SCHEMAS: dict[str, S] = {
    "Error": _obj(("error",), error=_obj(
        ("message", "type"), message=STR, type=STR, param=_nullable(STR),
        code=_nullable(STR))),
    "CompletionRequest": _obj(("prompt",), prompt=_PROMPT, suffix=_SUFFIX, **_OPTIONS,
                              **_COMPLETION_LOGPROBS),
    "ChatCompletionRequest": _obj(("messages",), messages={"type": "array", "items": _MESSAGE,
                                                           "minItems": 1},
                                  max_completion_tokens=_nullable({"type": "integer",
                                                                   "minimum": 1}),
                                  **_TOOLS, **_OPTIONS, **_CHAT_LOGPROBS),
    # one SSE event: `data` holds a chunk object (JSON), an Error envelope, or `[DONE]`
    "ServerSentEvent": _obj(("data",), data=STR, event=STR),
    "Completion": _result("text_completion", _obj(
        ("index", "text", "finish_reason"), index=INT, text=STR, finish_reason=_FINISH,
        logprobs=_COMPLETION_LOGPROB)),
    "ChatCompletion": _result("chat.completion", _obj(
        ("index", "message", "finish_reason"), index=INT, finish_reason=_FINISH,
        logprobs=_CHAT_LOGPROB,
        message=_obj(("role", "content"), role={"const": "assistant"}, content=_nullable(STR),
                     tool_calls={"type": "array", "items": _CALL}))),
    "ModelList": _page(_obj(("id", "object", "owned_by"), id=STR, object={"const": "model"},
                            created=INT, owned_by=STR, max_model_len=INT, root=STR,
                            parent=_nullable(STR))),
    # vLLM's run-time LoRA endpoints (gateway/lora_admin.py)
    "LoadLoraAdapter": _obj(("lora_name", "lora_path"), lora_name=STR, lora_path=STR),
    "UnloadLoraAdapter": _obj(("lora_name",), lora_name=STR),
    "Health": _obj(("status",), status={"enum": ["ok", "draining", "unhealthy"]},
                   detail=_nullable(STR)),
    "Timeline": _obj(("now", "since", "events", "requests"), now=NUM, since=NUM,
                     events={"type": "array", "items": {"type": "object"}},
                     requests={"type": "array", "items": {"type": "object"}}),
    "FileUpload": _obj(("file", "purpose"), file={"type": "string", "format": "binary"},
                       purpose={"const": "batch"}),
    "File": _FILE,
    "FileList": _page(_FILE),
    "FileDeleted": _obj(("id", "object", "deleted"), id=STR, object={"const": "file"},
                        deleted=BOOL),
    "BatchRequest": _obj(("input_file_id", "endpoint", "completion_window"),
                         input_file_id=STR, endpoint={"enum": list(ENDPOINTS)},
                         completion_window={"enum": list(COMPLETION_WINDOWS)},
                         metadata=_nullable({"type": "object", "additionalProperties": STR})),
    "Batch": _BATCH,
    "BatchList": _page(_BATCH),
    "TokenizeRequest": {"anyOf": [  # vLLM's: a text prompt, or chat messages
        _obj(("prompt",), model=_nullable(STR), prompt=STR,
             add_special_tokens=_nullable(BOOL), return_token_strs=_nullable(BOOL)),
        _obj(("messages",), model=_nullable(STR),
             messages={"type": "array", "items": _MESSAGE, "minItems": 1},
             add_generation_prompt=_nullable(BOOL), continue_final_message=_nullable(BOOL),
             add_special_tokens=_nullable(BOOL), return_token_strs=_nullable(BOOL))]},
    "Tokenize": _obj(("count", "max_model_len", "tokens", "token_strs"), count=INT,
                     max_model_len=INT, tokens={"type": "array", "items": INT},
                     token_strs=_nullable({"type": "array", "items": STR})),
    "DetokenizeRequest": _obj(("tokens",), model=_nullable(STR),
                              tokens={"type": "array", "items": {"type": "integer",
                                                                 "minimum": 0}}),
    "Detokenize": _obj(("prompt",), prompt=STR),
    "Version": _obj(("version",), version=STR),
    **_TENANT_SCHEMAS,
}
