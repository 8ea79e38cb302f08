"""A request as a policy sees it: an immutable record taken at the start of a round."""

from __future__ import annotations

from dataclasses import dataclass

from executors.types import Priority

Placement = tuple[str, ...]  # device name per operator of the chain


@dataclass(frozen=True, slots=True)
class RequestView:
    """One request as of the round's start. Counts are tokens; times monotonic seconds."""

    rid: str
    tenant: str
    priority: Priority
    arrival_s: float
    ttft_slo_s: float | None
    prompt_len: int
    max_tokens: int
    num_output: int  # tokens generated so far
    num_computed: int  # tokens whose KV is written
    placement: Placement | None  # None until admitted (fixed by its first prefill)
    kv_blocks: tuple[tuple[str, int], ...] = ()  # (device, blocks held) while admitted
    swapped: bool = False  # waiting with its first `num_computed` tokens of KV in host memory
    # while waiting: (device, tokens of its prefix cached there, blocks of that hit no
    # request holds) per device with a hit; admitted alone on it, it starts after those
    cached: tuple[tuple[str, int, int], ...] = ()
    kv_shared: tuple[tuple[str, int], ...] = ()  # (device, blocks others hold too) if admitted
    scores_prompt: bool = False  # asks for prompt log-probs: its prefill chunks run the head
    model: str = ""  # its model, in a server of several (models/modelset.py); "" = the only one
    tpot_slo_s: float | None = None  # its inter-token target (policies/pace.py); None: none
    last_token_s: float | None = None  # when its last token was emitted (None: none yet)
    # speculative decoding (scheduler/spec/): the tokens prompt lookup proposes after its
    # last one (empty when it does not speculate), and its acceptance rates so far
    # (`scheduler.spec.choice.Rates`: first draft, each next one after an accepted one)
    draft: tuple[int, ...] = ()
    acceptance: tuple[float, float] = (0.0, 0.0)

    @property
    def ttft_deadline(self) -> float | None:
        return None if self.ttft_slo_s is None else self.arrival_s + self.ttft_slo_s

    @property
    def is_paced(self) -> bool:
        """Decoding with an inter-token target: its next step has a deadline."""
        return self.tpot_slo_s is not None and self.num_output > 0 and not self.is_prefilling

    def next_token_deadline(self, now: float) -> float | None:
        """When its next token is due: its last one's time plus its TPOT SLO, or `now` plus
        the SLO once that moment has passed (a missed pace restarts from now)."""
        if self.tpot_slo_s is None:
            return None
        due = (self.last_token_s if self.last_token_s is not None else now) + self.tpot_slo_s
        return due if due > now else now + self.tpot_slo_s

    @property
    def num_tokens(self) -> int:
        """Prompt + generated tokens (what its KV holds once it is up to date)."""
        return self.prompt_len + self.num_output

    @property
    def is_prefilling(self) -> bool:
        """More than one token still to feed: a prompt (or a recompute after preemption)."""
        return self.num_tokens - self.num_computed > 1

    @property
    def kv_tokens(self) -> int:
        """KV a request reserves at admission: its tokens so far (it grows as tokens come)."""
        return self.num_tokens

    def blocks_held(self, device: str) -> int:
        return next((n for d, n in self.kv_blocks if d == device), 0)

    def blocks_freed(self, device: str) -> int:
        """Blocks that preempting it returns on `device` (those no other request shares)."""
        return self.blocks_held(device) - next((n for d, n in self.kv_shared if d == device), 0)
