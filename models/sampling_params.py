"""Per-request sampling parameters: the contract between the gateway and the head operator."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

MAX_PENALTY = 2.0  # |presence_penalty|, |frequency_penalty| at most (OpenAI's range)
MAX_LOGIT_BIAS = 100.0  # |bias| at most (OpenAI's range)
MAX_LOGPROBS = 20  # alternatives per position at most (vLLM's default cap)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How one request's next token is chosen and when its generation ends.

    `stop_token_ids` is the full set of ids that end generation (the gateway
    adds the tokenizer's EOS ids unless the client asked for `ignore_eos`).
    They are masked out of sampling until `min_tokens` tokens were generated.

    The penalties and `logit_bias` change the raw logits before temperature,
    top-k and top-p, as vLLM applies them: the bias is added, then
    `repetition_penalty` (transformers' rule, over prompt and generated tokens)
    divides a positive logit and multiplies a negative one, then
    `frequency_penalty * count + presence_penalty * (count > 0)` is subtracted,
    counting the generated tokens only (OpenAI's rule). Neutral values change nothing.

    `logprobs` / `prompt_logprobs` ask for the log-probabilities of the generated / prompt
    tokens and that many most likely alternatives at each position (`models.logprobs`:
    the raw model distribution, as vLLM's default). None asks for nothing.
    """

    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # nucleus mass in (0, 1]
    top_k: int = 0  # 0 = off
    seed: int | None = None  # same seed -> same tokens
    max_tokens: int = 16  # generated tokens, >= 1
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    presence_penalty: float = 0.0  # in [-2, 2]; 0 = off
    frequency_penalty: float = 0.0  # in [-2, 2]; 0 = off
    repetition_penalty: float = 1.0  # > 0; 1 = off
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias in [-100, 100]), ids unique
    logprobs: int | None = None  # top alternatives per generated token, 0..20; None = off
    prompt_logprobs: int | None = None  # the same for each prompt token after the first
    # NOTE: computed once: the sampler asks it of every row at every step (a property took
    # ~5 us per 29 rows, against a ~1 ms greedy step)
    adjusts_logits: bool = field(init=False, repr=False, compare=False)  # a penalty or bias

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
        self._check_penalties()
        for name in ("logprobs", "prompt_logprobs"):
            n = getattr(self, name)
            if n is not None and not 0 <= n <= MAX_LOGPROBS:
                raise ValueError(f"{name} must be in [0, {MAX_LOGPROBS}]")
        object.__setattr__(self, "adjusts_logits", self.penalizes or bool(self.logit_bias))

    def _check_penalties(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            if not abs(getattr(self, name)) <= MAX_PENALTY:  # NOTE: `not <=` also refuses NaN
                raise ValueError(f"{name} must be in [-{MAX_PENALTY}, {MAX_PENALTY}]")
        if not 0 < self.repetition_penalty < math.inf:
            raise ValueError("repetition_penalty must be > 0 and finite")
        ids = [token for token, _ in self.logit_bias]
        if any(token < 0 for token in ids) or len(set(ids)) != len(ids):
            raise ValueError("logit_bias token ids must be unique and >= 0")
        if not all(abs(bias) <= MAX_LOGIT_BIAS for _, bias in self.logit_bias):
            raise ValueError(f"logit_bias values must be in [-{MAX_LOGIT_BIAS}, "
                             f"{MAX_LOGIT_BIAS}]")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    @property
    def penalizes(self) -> bool:
        """A penalty is on: the sampler needs the request's generated tokens."""
        return (self.presence_penalty != 0 or self.frequency_penalty != 0
                or self.repetition_penalty != 1)

    def finish(self, token: int, num_generated: int) -> str | None:
        """The stop rule: "stop" when `token` (the `num_generated`-th, counting it) is a stop
        id past `min_tokens`, "length" at `max_tokens`, else None. The scheduler, the fake
        scheduler and `models.generate` all end a generation by it."""
        if token in self.stop_token_ids and num_generated > self.min_tokens:
            return "stop"
        if num_generated >= self.max_tokens:
            return "length"
        return None
