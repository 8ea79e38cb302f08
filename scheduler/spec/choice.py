"""How far to draft: per request, per step, from its acceptance so far and the cost of a verify.

A verify step of k drafts feeds k + 1 tokens and scores k + 1 rows: it costs
`cost(k)` against `cost(0)` for a plain decode step (the estimators' op times on
the two batch shapes). Acceptance is modelled with two rates: `first`, that the
first draft is accepted, and `next`, that a draft is accepted once the one
before it was. A step then emits on average E(k) = 1 + first * (1 + next + ...
+ next^(k-1)) tokens against 1. The choice is the k that maximises E(k) / cost(k),
and 0 (no drafting) unless that beats a plain step by `MIN_GAIN`: where drafts
are rarely accepted (plain chat) the scheduler stops drafting.

NOTE: one rate for every position (each draft accepted independently) fitted code
edits poorly: there a step accepts all its drafts (a copied run) or none (the edit,
or text the prompt lacks). Measured on spec-bench's code edits (k <= 5, 239 verify
steps): 79% of first drafts accepted, then 91-96% of each next one tried; the one-rate
EWMA fell after each rejection and drafted fewer than the 5 proposed in 122 steps, 77
of which then accepted all they drafted. Replayed over the same answers, the two rates
cut the modelled TPOT by about 5% (docs/speculation.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

PRIOR_FIRST = 0.6  # first-draft acceptance assumed before a request's first verify
PRIOR_NEXT = 0.9  # acceptance of a draft after an accepted one, before the first verify
EWMA_WEIGHT = 0.3  # weight of the latest verify step in each estimate
RECOVER = 0.05  # per step without drafts, `first` moves this far back to its prior
MIN_GAIN = 1.05  # drafting must promise this many times the tokens per second of a decode

Rates = tuple[float, float]  # (first, next): see the module docstring


@dataclass(slots=True)
class Acceptance:
    """A request's running estimates of its two acceptance rates (EWMAs)."""

    first: float = PRIOR_FIRST
    next: float = PRIOR_NEXT

    @property
    def rates(self) -> Rates:
        return (self.first, self.next)

    def observe(self, num_draft: int, num_accepted: int) -> None:
        """After a verify step: `num_accepted` of `num_draft` drafts were accepted."""
        if num_draft <= 0:
            return
        self.first += EWMA_WEIGHT * ((num_accepted > 0) - self.first)
        # NOTE: drafts are tried in order until the first rejection: past the first, a step
        # is `num_accepted - 1` successes and at most one failure (accepted / trials, the
        # geometric estimate); the drafts after a rejection were never tried and do not count
        trials = max(num_accepted - 1, 0) + (0 < num_accepted < num_draft)
        if trials:
            self.next += EWMA_WEIGHT * ((num_accepted - 1) / trials - self.next)

    def idle(self) -> None:
        """A step without drafts: `first` drifts back toward its prior, so drafting is
        retried."""
        self.first += RECOVER * (PRIOR_FIRST - self.first)


def expected_tokens(rates: Rates, k: int) -> float:
    """Tokens a verify of k drafts emits on average at acceptance `rates` (first, next)."""
    first, nxt = rates
    if k <= 0:
        return 1.0
    run = float(k) if nxt >= 1.0 else (1.0 - nxt ** k) / (1.0 - nxt)
    return 1.0 + first * run


def choose_k(rates: Rates, max_k: int, cost: Callable[[int], float],
             others: float = 0.0) -> int:
    """The number of drafts (0..max_k) maximising the step's expected tokens per second;
    0 unless that beats the plain step (`cost(0)`) by `MIN_GAIN`. `cost(k)`: the step's
    seconds with k drafts for this request; `others`: tokens the step's other members emit."""
    base = cost(0)
    if max_k <= 0 or base <= 0:
        return 0
    plain = (others + 1.0) / base
    best_k, best = 0, plain
    for k in range(1, max_k + 1):
        gain = (others + expected_tokens(rates, k)) / cost(k)
        if gain > best:
            best_k, best = k, gain
    return best_k if best >= MIN_GAIN * plain else 0


@dataclass(slots=True)
class SpecCounters:
    """vLLM's spec-decode counters, cumulative since start (`/metrics`)."""

    num_drafts: int = 0  # verify steps
    num_draft_tokens: int = 0  # tokens drafted in them
    num_accepted_tokens: int = 0  # drafted tokens accepted
    accepted_per_pos: list[int] = field(default_factory=list)  # [i]: accepted at draft position i
    # the same counters per model (`Request.model`: "" for one model), when `record` names it
    by_model: dict[str, SpecCounters] = field(default_factory=dict)

    def record(self, num_draft: int, num_accepted: int, model: str | None = None) -> None:
        """One verify step of `num_draft` drafts, `num_accepted` of them accepted; counted
        in `by_model[model]` too unless `model` is None."""
        if model is not None:
            self.by_model.setdefault(model, SpecCounters()).record(num_draft, num_accepted)
        self.num_drafts += 1
        self.num_draft_tokens += num_draft
        self.num_accepted_tokens += num_accepted
        if len(self.accepted_per_pos) < num_draft:
            self.accepted_per_pos += [0] * (num_draft - len(self.accepted_per_pos))
        for i in range(num_accepted):
            self.accepted_per_pos[i] += 1
