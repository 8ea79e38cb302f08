"""A request's speculation state in the scheduler: its config, acceptance, drafts in flight."""

from __future__ import annotations

from dataclasses import dataclass, field

from models.sampling_params import SamplingParams
from models.spec_config import SpecConfig
from scheduler.spec.choice import Acceptance
from scheduler.spec.ngram import propose


def eligible(sampling: SamplingParams, constrained: bool, num_output: int) -> bool:
    """Whether a request's next step may verify drafts exactly.

    NOTE: the verify path scores positions with the plain distribution only: requests
    with a grammar, log-probs, penalties or logit bias (per-position state), or still
    under `min_tokens` (stop tokens masked), decode without drafts instead."""
    return not (constrained or sampling.logprobs is not None or sampling.adjusts_logits
                or num_output < sampling.min_tokens)


@dataclass(slots=True)
class SpecState:
    """One speculating request: how it drafts and how its drafts fared."""

    config: SpecConfig
    acceptance: Acceptance = field(default_factory=Acceptance)
    in_flight: list[int] = field(default_factory=list)  # drafts of the step in flight

    def proposal(self, token_ids: list[int], room: int) -> tuple[int, ...]:
        """Drafts prompt lookup proposes after `token_ids`, at most `room` of them."""
        c = self.config
        k = min(c.num_speculative_tokens, room)
        if k < 1:
            return ()
        return tuple(propose(token_ids, k, c.prompt_lookup_min, c.prompt_lookup_max))
