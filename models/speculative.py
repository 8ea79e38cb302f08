"""Verification of drafted tokens: the exact acceptance rule of speculative decoding.

A verify step feeds a request's last known token and `k` drafted tokens after
it; the head scores all k + 1 positions. Position i's distribution p_i decides
on draft token i; the first rejected position yields a replacement, and when all
k are accepted position k yields a bonus token. So a step produces 1..k+1 tokens.

- Greedy: accept draft i while it equals argmax(p_i); the first mismatch's argmax
  is the replacement. Token for token what plain greedy decoding produces.
- Sampled: the proposer is deterministic (prompt lookup), so its q is one-hot on
  the draft token x: accept x with probability min(1, p(x) / q(x)) = p(x); on
  rejection draw from (p - q)+ renormalised, i.e. p with x's mass removed. This
  is the standard rejection rule (Leviathan et al. 2023), so each emitted token
  is distributed exactly as p: the output distribution is unchanged.

p is the distribution plain sampling draws from (`models.sampling`: temperature,
top-k, top-p). Requests whose logits need per-position state (penalties, logit
bias, min_tokens, grammars) or log-probs are never drafted for (the scheduler's
`eligible` rule), so the rows scored here need none of it.
"""

from __future__ import annotations

import torch

from models.batch import SeqSpec
from models.sampling import MAX_TEMPERATURE, MIN_TEMPERATURE, _candidates, _draw, _generator


def accept_greedy(logits: torch.Tensor, draft: list[int]) -> list[int]:
    """The tokens a greedy verify step emits: accepted drafts, then the first argmax that
    differs (or the bonus one after all were accepted)."""
    # logits: [k + 1, V]
    best = logits.max(-1).indices.tolist()  # [k + 1] (first maximal, as argmax)
    out: list[int] = []
    for i, x in enumerate(draft):
        out.append(best[i])
        if best[i] != x:
            return out
    out.append(best[len(draft)])
    return out


def probs_of(logits: torch.Tensor, seq: SeqSpec) -> torch.Tensor:
    """The distribution plain sampling draws from at each row, over the whole vocabulary."""
    # logits: [R, V] float32 -> [R, V] float32, rows summing to 1
    p = seq.sampling
    temperature = min(max(p.temperature, MIN_TEMPERATURE), MAX_TEMPERATURE)
    out = torch.zeros_like(logits)
    for r in range(logits.shape[0]):
        values, ids = _candidates(logits[r] / temperature, p)
        out[r, ids] = values.softmax(-1)
    return out


def accept_sampled(probs: torch.Tensor, draft: list[int],
                   generators: list[torch.Generator]) -> list[int]:
    """The tokens a sampled verify step emits under the rejection rule (module docstring);
    `generators[i]` draws position i's coins (k + 1 of them)."""
    # probs: [k + 1, V] float32
    out: list[int] = []
    for i, x in enumerate(draft):
        u = float(torch.rand((), generator=generators[i], device=probs.device))
        if u < float(probs[i, x]):
            out.append(x)
            continue
        rest = probs[i].clone()
        rest[x] = 0.0
        if float(rest.sum()) <= 0.0:  # NOTE: p was one-hot on x and u rounded past it
            out.append(x)
            continue
        out.append(_draw(rest / rest.sum(), generators[i]))
        return out
    out.append(_draw(probs[len(draft)], generators[len(draft)]))
    return out


def verify(logits: torch.Tensor, seq: SeqSpec) -> list[int]:
    """The tokens one sequence's verify step emits. logits: [k + 1, V] for its scored rows."""
    draft = seq.token_ids[len(seq.token_ids) - seq.num_draft:]
    if seq.sampling.is_greedy:
        return accept_greedy(logits, draft)
    # NOTE: position i uses the seed stream of the (num_generated + i)-th token, so seeded
    # requests repeat themselves; with a draft they differ from their plain run (same law)
    gens = [_generator(_at(seq, i), logits.device) for i in range(seq.num_draft + 1)]
    return accept_sampled(probs_of(logits.float(), seq), draft, gens)


def _at(seq: SeqSpec, i: int) -> SeqSpec:
    if i == 0:
        return seq
    return SeqSpec(seq.request_id, seq.token_ids, seq.num_past_tokens, seq.block_table,
                   sampling=seq.sampling, num_generated=seq.num_generated + i)
