"""Next-token sampling: greedy, temperature, top-k, top-p, per-request seed, min_tokens."""

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


def _mask_stops(logits: torch.Tensor, seq: SeqSpec) -> torch.Tensor:
    # logits: [V]; stop tokens may not end generation before min_tokens
    p = seq.sampling
    if seq.num_generated < p.min_tokens and p.stop_token_ids:
        logits = logits.clone()
        logits[list(p.stop_token_ids)] = float("-inf")
    return logits


def _filter(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    # logits: [V] float32, already divided by temperature
    if p.top_k > 0 and p.top_k < logits.shape[-1]:
        kth = torch.topk(logits, p.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if p.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        # drop a token when the mass before it already reaches top_p (the top one always stays)
        drop = probs.cumsum(-1) - probs >= p.top_p
        drop[0] = False  # NOTE: also when top_p rounds to 0 in float32 (e.g. 1e-300)
        logits = logits.index_fill(0, order[drop], float("-inf"))
    return logits


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
    logits = _mask_stops(logits.float(), seq)
    if p.is_greedy:
        return int(logits.argmax())
    temperature = min(max(p.temperature, MIN_TEMPERATURE), MAX_TEMPERATURE)
    probs = _filter(logits / temperature, p).softmax(-1)
    return int(torch.multinomial(probs, 1, generator=_generator(seq, logits.device)))


def sample(logits: torch.Tensor, seqs: list[SeqSpec]) -> list[int]:
    """One token per sequence. logits: [S, V] for the S sampled sequences, in order."""
    if all(s.sampling.is_greedy and s.num_generated >= s.sampling.min_tokens for s in seqs):
        return logits.argmax(-1).tolist()
    return [sample_one(logits[i], s) for i, s in enumerate(seqs)]
