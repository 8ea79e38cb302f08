"""Next-token sampling: logit bias and penalties, greedy, temperature, top-k, top-p,
per-request seed, min_tokens."""

from __future__ import annotations

import random

import torch

from models.batch import SeqSpec
from models.sampling_params import SamplingParams

_SEED_STRIDE = 1_000_003
# NOTE: temperatures are clamped to what float32 logits survive: dividing by a temperature
# near 0 overflows to inf and by a huge one underflows to 0 (a masked -inf then becomes NaN);
# outside this range the distribution is already one-hot or uniform.
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-4, 1e4
# NOTE: and so are repetition penalties: a float32 logit divided by one near 0 overflows (0 / 0
# is NaN); past this range penalized tokens are already forced or out of reach.
MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY = 1e-4, 1e4


def _adjust(logits: torch.Tensor, seq: SeqSpec) -> torch.Tensor:
    """The raw logits with `logit_bias` added, then the penalties applied, in vLLM's order
    (a new tensor; `SamplingParams` states the rules)."""
    # logits: [V] float32
    p = seq.sampling
    if p.logit_bias:
        logits = _bias(logits, p.logit_bias)
    if p.penalizes:
        prompt, out = _history(seq, logits.device)
        logits = _penalize(logits, p, prompt, out)
    return logits


def _bias(logits: torch.Tensor, bias: tuple[tuple[int, float], ...]) -> torch.Tensor:
    # logits: [V] -> [V]
    ids = torch.tensor([t for t, _ in bias], device=logits.device)  # [B] long
    values = torch.tensor([b for _, b in bias], dtype=logits.dtype, device=logits.device)  # [B]
    return logits.index_add(0, ids, values)


def _history(seq: SeqSpec, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(prompt ids [P], generated ids [G]) that the penalties count."""
    h = seq.history
    if h is None:
        raise ValueError(f"{seq.request_id}: its penalties need its token history")
    out = torch.tensor(h.output_ids[:seq.num_generated], dtype=torch.long, device=device)  # [G]
    return torch.tensor(h.prompt_ids, dtype=torch.long, device=device), out  # [P], [G]


def _penalize(logits: torch.Tensor, p: SamplingParams, prompt: torch.Tensor,
              out: torch.Tensor) -> torch.Tensor:
    # logits: [V], prompt: [P], out: [G] -> [V]
    if p.repetition_penalty != 1:
        r = min(max(p.repetition_penalty, MIN_REPETITION_PENALTY), MAX_REPETITION_PENALTY)
        seen = torch.cat([prompt, out]).unique()  # [U] each token once
        score = logits[seen]  # [U]
        score = torch.where(score < 0, score * r, score / r)
        logits = logits.index_put((seen,), score)
    if p.presence_penalty or p.frequency_penalty:
        ids, counts = out.unique(return_counts=True)  # [N], [N]
        cost = p.frequency_penalty * counts.to(logits.dtype) + p.presence_penalty  # [N]
        logits = logits.index_add(0, ids, -cost)
    return logits


def _mask_stops(logits: torch.Tensor, seq: SeqSpec) -> torch.Tensor:
    # logits: [V]; stop tokens may not end generation before min_tokens
    p = seq.sampling
    if seq.num_generated < p.min_tokens and p.stop_token_ids:
        masked = logits.clone()
        masked[list(p.stop_token_ids)] = float("-inf")
        # NOTE: where a grammar allows only a stop, the stop ends the request before
        # min_tokens: masking it too would leave nothing to sample
        if seq.constraint is None or bool(masked.isfinite().any()):
            return masked
    return logits


NUCLEUS_FIRST = 64  # top-p looks at this many leading tokens first, 8x more while short


def _candidates(logits: torch.Tensor, p: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens top-k and top-p keep: (logits, ids), most likely first."""
    # logits: [V] float32, already divided by temperature
    ids = None
    if 0 < p.top_k < logits.shape[-1]:
        logits, ids = torch.topk(logits, p.top_k)
    if p.top_p < 1.0:
        logits, order = _top_p(logits, p.top_p)
        ids = order if ids is None else ids[order]
    return logits, torch.arange(logits.shape[-1]) if ids is None else ids


def _top_p(logits: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The nucleus: the leading logits whose mass before each is below top_p (the top one
    always stays, also when top_p rounds to 0 in float32), and their positions.

    NOTE: the same tokens a full descending sort keeps, from `torch.topk` of a few
    (64, 512, ...): sorting a 49k vocabulary took ~3 ms per sampled row on a CPU."""
    # logits: [n] -> ([m], [m]), m <= n
    n = logits.shape[-1]
    lse = torch.logsumexp(logits, -1)
    k = min(n, NUCLEUS_FIRST)
    while True:
        values, order = torch.topk(logits, k)
        probs = (values - lse).exp()
        drop = probs.cumsum(-1) - probs >= top_p
        drop[0] = False
        if bool(drop.any()):
            keep = int(drop.int().argmax())  # the first dropped
            return values[:keep], order[:keep]
        if k == n:
            return values, order
        k = min(n, k * 8)


def _generator(seq: SeqSpec, device: torch.device) -> torch.Generator:
    seed = seq.sampling.seed
    g = torch.Generator(device=device)
    if seed is None:
        g.manual_seed(random.getrandbits(63))
    else:
        g.manual_seed((seed * _SEED_STRIDE + seq.num_generated) % (1 << 63))
    return g


def sample_one(logits: torch.Tensor, seq: SeqSpec) -> int:
    # logits: [V]
    p = seq.sampling
    logits = logits.float()
    if p.adjusts_logits:
        logits = _adjust(logits, seq)
    logits = _mask_stops(logits, seq)
    if p.is_greedy:
        return int(logits.argmax())
    temperature = min(max(p.temperature, MIN_TEMPERATURE), MAX_TEMPERATURE)
    values, ids = _candidates(logits / temperature, p)
    return int(ids[_draw(values.softmax(-1), _generator(seq, logits.device))])


def _draw(probs: torch.Tensor, g: torch.Generator) -> int:
    """An index drawn with these probabilities (inverse CDF; never a zero-probability one).

    NOTE: `torch.multinomial` over a 49k vocabulary took ~1 ms per row on a CPU."""
    # probs: [k] float32, summing to ~1
    cdf = probs.cumsum(-1)
    x = torch.rand((), generator=g, device=probs.device) * cdf[-1]
    i = int(torch.searchsorted(cdf, x[None], right=True))  # first with cdf > x
    if i >= probs.shape[-1]:  # x rounded up to the total
        i = int(probs.nonzero()[-1])
    return i


def _constrain(logits: torch.Tensor, seqs: list[SeqSpec]) -> None:
    """Each constrained row's forbidden tokens to -inf, in place (one masked_fill a row)."""
    # logits: [S, V]
    for i, s in enumerate(seqs):
        if s.constraint is not None:
            logits[i].masked_fill_(s.constraint.banned().to(logits.device), float("-inf"))


def sample(logits: torch.Tensor, seqs: list[SeqSpec]) -> list[int]:
    """One token per sequence. logits: [S, V] for the S sampled sequences, in order."""
    if any(s.constraint is not None for s in seqs):
        _constrain(logits, seqs)
    if all(s.sampling.is_greedy and s.num_generated >= s.sampling.min_tokens
           and not s.sampling.adjusts_logits for s in seqs):
        # NOTE: max's indices, the first maximal value as argmax's, in ~1/3 of its time on
        # a CPU (0.76 against 2.06 ms for 29 rows of a 49k vocabulary)
        return logits.max(-1).indices.tolist()
    return [sample_one(logits[i], s) for i, s in enumerate(seqs)]
