from __future__ import annotations

import math

import pytest
import torch
from transformers import RepetitionPenaltyLogitsProcessor

from models.batch import SeqSpec, TokenHistory
from models.sampling import _adjust, _candidates, _draw, sample, sample_one
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



# -- logit bias and penalties -------------------------------------------------------------


def _penalized(prompt: list[int], output: list[int], num_generated: int | None = None,
               **kw: object) -> SeqSpec:
    params = SamplingParams(**kw)  # type: ignore[arg-type]
    n = len(output) if num_generated is None else num_generated
    return SeqSpec("r", [1], 0, [0], sample=True, sampling=params, num_generated=n,
                   history=TokenHistory.of(params, prompt, output))


def _ref_bias(logits: torch.Tensor, bias: dict[int, float]) -> torch.Tensor:
    out = logits.clone()
    for token, b in bias.items():
        out[token] += b
    return out


def _ref_repetition(logits: torch.Tensor, seen: list[int], penalty: float) -> torch.Tensor:
    # transformers' RepetitionPenaltyLogitsProcessor, one token at a time
    out = logits.clone()
    for token in set(seen):
        v = float(logits[token])
        out[token] = v * penalty if v < 0 else v / penalty
    return out


def _ref_openai(logits: torch.Tensor, generated: list[int], presence: float,
                frequency: float) -> torch.Tensor:
    # OpenAI's rule: logit -= count * frequency + (count > 0) * presence
    out = logits.clone()
    for token in set(generated):
        out[token] -= generated.count(token) * frequency + presence
    return out


PROMPT, OUTPUT = [3, 7, 7, 11, 40], [7, 12, 12, 12, 5, 49]


def _logits(v: int = 50) -> torch.Tensor:
    return torch.randn(v, generator=torch.Generator().manual_seed(5)) * 4  # both signs


@pytest.mark.parametrize("penalty", [0.5, 1.3, 2.0])
def test_repetition_penalty_counts_prompt_and_output(penalty: float) -> None:
    logits = _logits()
    got = _adjust(logits, _penalized(PROMPT, OUTPUT, repetition_penalty=penalty))
    want = _ref_repetition(logits, PROMPT + OUTPUT, penalty)
    assert torch.allclose(got, want)
    hf = RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([PROMPT + OUTPUT]), logits[None])
    assert torch.allclose(got, hf[0])
    assert not torch.equal(got, logits)


def test_repetition_penalty_pushes_negative_logits_down() -> None:
    logits = torch.tensor([-2.0, 1.0, 0.0, 3.0])
    got = _adjust(logits, _penalized([0, 1], [2], repetition_penalty=2.0))
    assert got.tolist() == [-4.0, 0.5, 0.0, 3.0]


@pytest.mark.parametrize(("presence", "frequency"), [(0.7, 0.0), (0.0, 0.4), (1.5, -0.5),
                                                     (-2.0, 2.0)])
def test_presence_and_frequency_count_the_generated_tokens_only(presence: float,
                                                                 frequency: float) -> None:
    logits = _logits()
    got = _adjust(logits, _penalized(PROMPT, OUTPUT, presence_penalty=presence,
                                     frequency_penalty=frequency))
    assert torch.allclose(got, _ref_openai(logits, OUTPUT, presence, frequency))
    assert got[3] == logits[3] and got[40] == logits[40]  # in the prompt only


def test_penalties_read_only_the_tokens_generated_before_this_run() -> None:
    logits = _logits()
    seq = _penalized(PROMPT, OUTPUT, num_generated=3, frequency_penalty=1.0,
                     repetition_penalty=1.5)
    want = _ref_openai(_ref_repetition(logits, PROMPT + OUTPUT[:3], 1.5), OUTPUT[:3], 0.0, 1.0)
    assert torch.allclose(_adjust(logits, seq), want)


def test_logit_bias_is_added() -> None:
    logits = _logits()
    bias = {0: 5.0, 17: -3.5, 49: 100.0}
    got = _adjust(logits, _seq(logit_bias=tuple(bias.items())))
    assert torch.allclose(got, _ref_bias(logits, bias))


def test_bias_then_repetition_then_presence_and_frequency() -> None:
    logits = _logits()
    bias = {7: 2.0, 12: -1.0, 30: 4.0}
    seq = _penalized(PROMPT, OUTPUT, logit_bias=tuple(bias.items()), repetition_penalty=1.3,
                     presence_penalty=0.5, frequency_penalty=0.25)
    want = _ref_openai(_ref_repetition(_ref_bias(logits, bias), PROMPT + OUTPUT, 1.3),
                       OUTPUT, 0.5, 0.25)
    assert torch.allclose(_adjust(logits, seq), want)


def test_bias_minus_100_bans_a_token() -> None:
    logits = torch.tensor([0.0, 5.0, 4.0, 1.0])
    banned = _seq(temperature=0, logit_bias=((1, -100.0),))
    assert sample(logits[None], [banned]) == [2]
    hot = [sample_one(logits, _seq(temperature=1.0, seed=s, logit_bias=((1, -100.0),)))
           for s in range(300)]
    assert 1 not in hot and {0, 2, 3} <= set(hot)


def test_bias_plus_100_forces_a_token_under_greedy() -> None:
    logits = torch.randn(3, 1000, generator=torch.Generator().manual_seed(2)) * 5
    least = int(logits[1].argmin())
    seqs = [_seq(temperature=0), _seq(temperature=0, logit_bias=((least, 100.0),)),
            _seq(temperature=0)]
    assert sample(logits, seqs) == [int(logits[0].argmax()), least, int(logits[2].argmax())]


def test_min_tokens_still_masks_a_biased_stop_id() -> None:
    logits = torch.tensor([0.0, 1.0, 2.0])
    seq = _seq(temperature=0, stop_token_ids=(0,), min_tokens=2, max_tokens=4,
               logit_bias=((0, 100.0),), num_generated=1)
    assert sample(logits[None], [seq]) == [2]


def test_a_greedy_repetition_penalty_changes_the_choice() -> None:
    logits = torch.tensor([0.0, 3.0, 2.5])
    assert sample(logits[None], [_penalized([1], [], temperature=0)]) == [1]
    assert sample(logits[None], [_penalized([1], [], temperature=0,
                                            repetition_penalty=1.3)]) == [2]


def test_penalties_without_the_history_fail_loudly() -> None:
    with pytest.raises(ValueError, match="token history"):
        sample_one(torch.zeros(4), _seq(presence_penalty=1.0))


def test_history_only_when_a_penalty_reads_it() -> None:
    prompt, out = [1, 2], [3]
    assert TokenHistory.of(SamplingParams(logit_bias=((1, 2.0),)), prompt, out) is None
    only_out = TokenHistory.of(SamplingParams(presence_penalty=0.1), prompt, out)
    assert only_out is not None and only_out.prompt_ids == [] and only_out.output_ids is out
    both = TokenHistory.of(SamplingParams(repetition_penalty=1.1), prompt, out)
    assert both is not None and both.prompt_ids is prompt and both.output_ids is out


@pytest.mark.parametrize("bad", [
    dict(presence_penalty=2.5), dict(frequency_penalty=-2.01), dict(presence_penalty=math.nan),
    dict(repetition_penalty=0), dict(repetition_penalty=-1.0), dict(repetition_penalty=math.inf),
    dict(logit_bias=((1, 100.5),)), dict(logit_bias=((-1, 1.0),)),
    dict(logit_bias=((3, 1.0), (3, 2.0))), dict(logit_bias=((3, math.nan),)),
])
def test_invalid_penalties_and_bias_rejected(bad: dict) -> None:
    with pytest.raises(ValueError):
        SamplingParams(**bad)


@pytest.mark.parametrize("penalty", [5e-324, 1e-300, 1e-30, 1e30, 1.7e308])
@pytest.mark.parametrize("temperature", [0.0, 1e-30, 1.0])
def test_extreme_repetition_penalties_sample_a_valid_token(penalty: float,
                                                           temperature: float) -> None:
    logits = torch.cat([torch.randn(49), torch.zeros(1)])  # a zero logit among the seen
    seq = _penalized([1, 2, 49], [3, 4], repetition_penalty=penalty, temperature=temperature,
                     top_p=0.9, seed=3)
    assert bool(_adjust(logits, seq).isfinite().all())
    assert 0 <= sample_one(logits, seq) < 50
