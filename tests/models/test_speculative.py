"""The acceptance rule of speculative decoding (pure): greedy prefix, sampled rejection."""

from __future__ import annotations

import torch

from models.batch import SeqSpec
from models.sampling_params import SamplingParams
from models.speculative import accept_greedy, accept_sampled, probs_of, verify

# chi-square critical value at p = 0.001 for 4 degrees of freedom (5 categories)
CHI2_4_999 = 18.467


def _logits(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def test_greedy_accepts_the_longest_prefix_equal_to_the_argmax() -> None:
    logits = _logits([[0, 5, 1], [4, 0, 1], [0, 0, 9], [7, 0, 0]])  # argmax 1, 0, 2, 0
    assert accept_greedy(logits, [1, 0, 2]) == [1, 0, 2, 0]  # all accepted, then the bonus
    assert accept_greedy(logits, [1, 2, 2]) == [1, 0]  # rejected at 1: its argmax instead
    assert accept_greedy(logits, [2, 0, 2]) == [1]  # rejected at once


def test_greedy_ties_go_to_the_first_maximal_token_as_plain_decoding() -> None:
    logits = _logits([[3, 3, 0], [1, 1, 1]])
    assert accept_greedy(logits, [1]) == [0]
    assert accept_greedy(logits, [0]) == [0, 0]


def _chi2(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def _first_tokens(p: torch.Tensor, draft: list[int], n: int, seed: int) -> torch.Tensor:
    probs = torch.stack([p] * (len(draft) + 1))
    counts = torch.zeros(p.shape[0])
    for i in range(n):
        gens = [torch.Generator().manual_seed(seed * 1_000_003 + i * 7 + j)
                for j in range(len(draft) + 1)]
        counts[accept_sampled(probs, draft, gens)[0]] += 1
    return counts


def test_sampled_rule_leaves_the_distribution_unchanged() -> None:
    p = torch.tensor([0.05, 0.4, 0.25, 0.2, 0.1])
    for draft in ([1], [4], [0, 2]):  # a likely draft, an unlikely one, two drafts
        counts = _first_tokens(p, draft, 6000, seed=draft[0])
        assert _chi2(counts, p) < CHI2_4_999, (draft, counts)


def test_sampled_rule_can_tell_a_wrong_distribution() -> None:
    p = torch.tensor([0.05, 0.4, 0.25, 0.2, 0.1])
    counts = _first_tokens(p, [1], 6000, seed=3)
    biased = torch.tensor([0.05, 0.5, 0.2, 0.15, 0.1])  # what accepting x too often gives
    assert _chi2(counts, biased) > CHI2_4_999


def test_sampled_bonus_after_all_accepted_is_drawn_from_the_last_position() -> None:
    probs = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    gens = [torch.Generator().manual_seed(i) for i in range(3)]
    assert accept_sampled(probs, [1, 2], gens) == [1, 2, 0]
    # a draft of zero probability is always rejected, replaced from p
    assert accept_sampled(probs, [0, 2], gens) == [1]


def test_probs_follow_temperature_top_k_and_top_p() -> None:
    seq = SeqSpec("r", [1, 2], 0, [0], sample=True,
                  sampling=SamplingParams(temperature=0.5, top_k=2))
    p = probs_of(_logits([[2.0, 1.0, 0.0, -1.0]]), seq)
    assert p[0, 2:].sum() == 0 and torch.isclose(p[0].sum(), torch.tensor(1.0))
    assert torch.isclose(p[0, 0] / p[0, 1], torch.tensor(2.0).exp())


def test_verify_takes_the_drafts_from_the_fed_tokens() -> None:
    greedy = SeqSpec("r", [9, 1, 0], 4, [0], sample=True,
                     sampling=SamplingParams(temperature=0), num_draft=2)
    logits = _logits([[0, 5, 1], [4, 0, 1], [0, 0, 9]])
    assert verify(logits, greedy) == [1, 0, 2]
    seeded = SeqSpec("r", [9, 1, 0], 4, [0], sample=True,
                     sampling=SamplingParams(temperature=1.0, seed=7), num_draft=2)
    assert verify(logits, seeded) == verify(logits, seeded)  # a seed repeats itself
