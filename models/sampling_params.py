"""Per-request sampling parameters: the contract between the gateway and the head operator."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How one request's next token is chosen and when its generation ends.

    `stop_token_ids` is the full set of ids that end generation (the gateway
    adds the tokenizer's EOS ids unless the client asked for `ignore_eos`).
    They are masked out of sampling until `min_tokens` tokens were generated.
    """

    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # nucleus mass in (0, 1]
    top_k: int = 0  # 0 = off
    seed: int | None = None  # same seed -> same tokens
    max_tokens: int = 16  # generated tokens, >= 1
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError("min_tokens must be in [0, max_tokens]")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    def finish(self, token: int, num_generated: int) -> str | None:
        """The stop rule: "stop" when `token` (the `num_generated`-th, counting it) is a stop
        id past `min_tokens`, "length" at `max_tokens`, else None. The scheduler, the fake
        scheduler and `models.generate` all end a generation by it."""
        if token in self.stop_token_ids and num_generated > self.min_tokens:
            return "stop"
        if num_generated >= self.max_tokens:
            return "length"
        return None
