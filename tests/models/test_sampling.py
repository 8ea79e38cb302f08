from __future__ import annotations

import pytest
import torch

from models.batch import SeqSpec
from models.sampling import _candidates, _draw, sample, sample_one
from models.sampling_params import SamplingParams


def _seq(**kw: object) -> SeqSpec:
    gen = int(kw.pop("num_generated", 0))  # type: ignore[call-overload]
    return SeqSpec("r", [1], 0, [0], sample=True, sampling=SamplingParams(**kw),  # type: ignore[arg-type]
                   num_generated=gen)


def test_greedy_picks_argmax() -> None:
    logits = torch.tensor([[0.1, 3.0, 2.0], [5.0, 0.0, 1.0]])
    assert sample(logits, [_seq(temperature=0), _seq(temperature=0)]) == [1, 0]


def test_greedy_takes_the_first_of_tied_maxima() -> None:
    logits = torch.tensor([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0], [0.0, 0.0, 0.0]])
    assert sample(logits, [_seq(temperature=0)] * 3) == [1, 0, 0]


def test_top_k_one_is_greedy_even_when_hot() -> None:
    logits = torch.randn(1000)
    assert sample_one(logits, _seq(temperature=5.0, top_k=1)) == int(logits.argmax())


def test_same_seed_same_tokens_different_seed_differs() -> None:
    logits = torch.zeros(1000)
    a = [sample_one(logits, _seq(seed=3, num_generated=i)) for i in range(20)]
    b = [sample_one(logits, _seq(seed=3, num_generated=i)) for i in range(20)]
    c = [sample_one(logits, _seq(seed=4, num_generated=i)) for i in range(20)]
    assert a == b and a != c


def test_top_p_keeps_only_the_nucleus() -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    seen = {sample_one(logits, _seq(top_p=0.7, seed=s)) for s in range(200)}
    assert seen == {0, 1}


def test_top_k_restricts_support() -> None:
    logits = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1]))
    seen = {sample_one(logits, _seq(top_k=2, seed=s)) for s in range(200)}
    assert seen == {0, 1}


def test_min_tokens_masks_stop_ids() -> None:
    logits = torch.tensor([0.0, 10.0, 1.0])  # stop id 1 would win
    early = _seq(temperature=0, stop_token_ids=(1,), min_tokens=2, max_tokens=5, num_generated=1)
    late = _seq(temperature=0, stop_token_ids=(1,), min_tokens=2, max_tokens=5, num_generated=2)
    assert sample(logits[None], [early]) == [2]
    assert sample(logits[None], [late]) == [1]


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=0), dict(top_k=-1),
                                 dict(max_tokens=0), dict(min_tokens=5, max_tokens=2)])
def test_invalid_params_rejected(bad: dict) -> None:
    with pytest.raises(ValueError):
        SamplingParams(**bad)


@pytest.mark.parametrize("top_p", [1.0, 0.5, 2.2e-313])
@pytest.mark.parametrize("temperature", [1e-300, 1e-30, 4.6e131, float(2**1000)])
def test_extreme_temperatures_sample_a_valid_token(temperature: float, top_p: float) -> None:
    logits = torch.randn(50)
    seq = SeqSpec("r", [1], 0, [0], sample=True,
                  sampling=SamplingParams(temperature=temperature, top_p=top_p, seed=3,
                                          min_tokens=2, stop_token_ids=(5,)))
    token = sample_one(logits, seq)
    assert 0 <= token < 50 and token != 5


def _nucleus_by_sort(logits: torch.Tensor, top_p: float) -> set[int]:
    # the rule as a full descending sort states it
    values, order = torch.sort(logits, descending=True)
    probs = values.softmax(-1)
    drop = probs.cumsum(-1) - probs >= top_p
    drop[0] = False
    return set(order[~drop].tolist())


@pytest.mark.parametrize("scale", [0.01, 1.0, 30.0])  # a nucleus of thousands, tens, one
@pytest.mark.parametrize("top_p", [1e-9, 0.3, 0.9, 0.999])
def test_top_p_keeps_the_tokens_a_full_sort_keeps(scale: float, top_p: float) -> None:
    logits = torch.randn(49152, generator=torch.Generator().manual_seed(7)) * scale
    values, ids = _candidates(logits, SamplingParams(top_p=top_p))
    assert set(ids.tolist()) == _nucleus_by_sort(logits, top_p)
    assert torch.equal(values, logits[ids]) and bool((values[:-1] >= values[1:]).all())


def test_top_k_then_top_p_keeps_the_nucleus_of_the_top_k() -> None:
    logits = torch.randn(5000, generator=torch.Generator().manual_seed(8))
    _, ids = _candidates(logits, SamplingParams(top_k=100, top_p=0.5))
    top = torch.topk(logits, 100).indices
    want = {int(top[i]) for i in _nucleus_by_sort(logits[top], 0.5)}
    assert set(ids.tolist()) == want


def test_draw_follows_the_probabilities_and_skips_zeros() -> None:
    probs = torch.tensor([0.0, 0.5, 0.0, 0.3, 0.2, 0.0])
    g = torch.Generator().manual_seed(9)
    counts = torch.bincount(torch.tensor([_draw(probs, g) for _ in range(4000)]), minlength=6)
    assert counts[[0, 2, 5]].sum() == 0
    assert torch.allclose(counts.float() / 4000, probs, atol=0.03)


@pytest.mark.parametrize(("token", "n", "want"), [
    (2, 1, "stop"),  # a stop id past min_tokens (0)
    (5, 1, None),  # not a stop id, under max_tokens
    (5, 4, "length"),  # the max_tokens-th token
    (2, 4, "stop"),  # a stop id at max_tokens is a stop
])
def test_finish_is_the_stop_rule(token: int, n: int, want: str | None) -> None:
    assert SamplingParams(max_tokens=4, stop_token_ids=(2,)).finish(token, n) == want


def test_finish_masks_stop_ids_until_min_tokens() -> None:
    p = SamplingParams(max_tokens=8, min_tokens=3, stop_token_ids=(2,))
    assert [p.finish(2, n) for n in (1, 2, 3, 4)] == [None, None, None, "stop"]

