"""The context limit a server starts with: the model's (or `--max-model-len`), capped to
what one device's KV cache can hold for one request.

A request's KV lives in one device's pool at most as large as that pool above its
admission watermark (`scheduler.memory.kv.KVManager.max_request_tokens`). On a small
budget (`--device-memory-gib`) the model's own context may not fit: every chat without
`max_tokens`, whose default is the rest of the context, would then be refused. So:

- the limit left to the model's (no `--max-model-len`) is capped to what fits, with one
  warning at start-up naming the cap and the flags that change it; `/v1/models` reports
  the cap, chats without `max_tokens` get the rest of it and grow their KV on demand;
- a `--max-model-len` (or `model.max_model_len`) that cannot fit stops the start-up with
  an error naming the most that fits, as vLLM does: the operator asked for it explicitly.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from gateway.config import ConfigError

logger = logging.getLogger("gateway")


@dataclass(frozen=True, slots=True)
class ContextLimit:
    """The context a server serves, and why when it is less than the one asked for."""

    max_model_len: int  # tokens of prompt + max_tokens a request may reach
    note: str = ""  # for the 400s past it: why it is lower than the model's ("" if it is not)

    def __post_init__(self) -> None:
        if self.max_model_len < 2:
            raise ValueError("max_model_len must be >= 2")


def context_limit(asked: int, explicit: bool, fit_tokens: int, memory: str) -> ContextLimit:
    """The context to serve: `asked` (the model's limit, or the configured one when
    `explicit`) if one device's KV holds `fit_tokens` >= it; else the cap `fit_tokens`, or
    a ConfigError when `explicit`. `memory`: the flags that size the KV, as set
    (e.g. "--device-memory-gib 0.6"), for the messages."""
    if asked <= fit_tokens:
        return ContextLimit(asked)
    if explicit:
        raise ConfigError(f"--max-model-len (model.max_model_len) {asked} does not fit: one "
                          f"device's KV cache holds {fit_tokens} tokens for one request with "
                          f"{memory}; lower --max-model-len to {fit_tokens} or less, or give "
                          f"each device more memory")
    if fit_tokens < 2:
        raise ConfigError(f"one device's KV cache holds {fit_tokens} tokens with {memory}: "
                          f"too few to serve; give each device more memory")
    logger.warning("context capped to %d tokens (the model's is %d): that is what one "
                   "device's KV cache holds for one request with %s; a larger budget raises "
                   "it, --max-model-len N (N <= %d) sets it", fit_tokens, asked, memory,
                   fit_tokens)
    return ContextLimit(fit_tokens, f" (capped at start-up to what one device's KV cache "
                                    f"holds with {memory}; see --max-model-len)")
