"""`SpecConfig`: vLLM's `--speculative-config` for prompt-lookup (n-gram) drafting."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MAX_SPECULATIVE_TOKENS = 16  # k at most: a verify step scores k + 1 rows
MAX_LOOKUP = 64  # longest n-gram looked up
_FIELDS = ("method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min")


@dataclass(frozen=True, slots=True)
class SpecConfig:
    """Prompt-lookup drafting, with vLLM's field names and meaning.

    Each decode step may draft up to `num_speculative_tokens` tokens: the tokens that
    followed the earliest earlier occurrence of the longest n-gram (n in
    [prompt_lookup_min, prompt_lookup_max]) that ends the request's tokens so far
    (prompt + output). The scheduler may draft fewer, or none (`scheduler.spec.choice`).
    Construct from JSON with `from_json` / `from_dict` (vLLM's defaults apply there).
    """

    num_speculative_tokens: int
    prompt_lookup_max: int
    prompt_lookup_min: int = 1
    method: str = "ngram"

    def __post_init__(self) -> None:
        if self.method != "ngram":
            raise ValueError(f"speculative method {self.method!r} is not supported "
                             "(only 'ngram': prompt lookup)")
        for name in ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an integer")
        if not 1 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"num_speculative_tokens must be in [1, {MAX_SPECULATIVE_TOKENS}]")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max <= MAX_LOOKUP:
            raise ValueError("prompt_lookup_min and prompt_lookup_max must satisfy "
                             f"1 <= prompt_lookup_min <= prompt_lookup_max <= {MAX_LOOKUP}")

    @classmethod
    def from_dict(cls, d: Any) -> SpecConfig:
        """From vLLM's JSON object. As vLLM: with neither lookup bound both are 5, with one
        the other equals it."""
        if not isinstance(d, dict):
            raise ValueError("a speculative config must be a JSON object")
        unknown = sorted(set(d) - set(_FIELDS))
        if unknown:
            raise ValueError(f"unknown speculative config field(s): {', '.join(unknown)}")
        if "num_speculative_tokens" not in d:
            raise ValueError("a speculative config needs num_speculative_tokens")
        lo: Any = d.get("prompt_lookup_min")
        hi: Any = d.get("prompt_lookup_max")
        if lo is None and hi is None:
            lo = hi = 5
        return cls(d["num_speculative_tokens"], lo if hi is None else hi,
                   hi if lo is None else lo, d.get("method", "ngram"))

    @classmethod
    def from_json(cls, text: str) -> SpecConfig:
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"a speculative config must be JSON: {e}") from None
        return cls.from_dict(d)

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _FIELDS}
