"""Log-probs of sampled and prompt tokens equal transformers' log-softmax of the same prefix."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

import models
from models.batch import SeqSpec, build_batch
from models.generate import run_chain
from models.kv_cache import blocks_for
from models.logprobs import HeadOutput, TokenLogprobs, unpack
from models.sampling_params import SamplingParams

BLOCK = 4
PROMPT = [3, 17, 42, 5, 99, 7, 12, 64, 8]
TOLERANCE = {"float32": 1e-3, "bfloat16": 2e-2}


def _hf_logprobs(path: Path, ids: list[int]) -> torch.Tensor:
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)  # [n, V]


def _generate(model: models.Model, params: SamplingParams, steps: int, chunk: int
              ) -> tuple[list[int], list[TokenLogprobs | None], list[TokenLogprobs]]:
    """Greedy steps of PROMPT fed in prefill chunks of `chunk` tokens, with its log-probs."""
    total = len(PROMPT) + steps
    kv = model.new_kv_cache(blocks_for(total, BLOCK), BLOCK)
    table = kv.allocator.allocate(blocks_for(total, BLOCK))
    tokens: list[int] = []
    sampled: list[TokenLogprobs | None] = []
    prompt: list[TokenLogprobs] = []
    past = 0
    while len(tokens) < steps:
        ids = PROMPT + tokens
        feed = ids[past:past + chunk] if past < len(PROMPT) else ids[past:]
        end = min(len(PROMPT), past + len(feed) + 1)
        seq = SeqSpec("r", feed, past, table, sample=past + len(feed) >= len(PROMPT),
                      sampling=params, num_generated=len(tokens),
                      prompt_targets=PROMPT[past + 1:end] if end > past + 1 else None)
        got, lps, by_rid = unpack(run_chain(model, build_batch([seq], BLOCK, model.device), kv))
        prompt += by_rid.get("r", [])
        past += len(feed)
        if seq.sample:
            tokens += got
            sampled += lps or [None]
    return tokens, sampled, prompt


@pytest.mark.parametrize("dtype", sorted(TOLERANCE))
def test_greedy_and_prompt_logprobs_equal_transformers(tiny_model_dir: Path, dtype: str) -> None:
    model = models.load(tiny_model_dir, dtype=dtype, layers_per_group=2)
    params = SamplingParams(temperature=0.0, max_tokens=4, logprobs=5, prompt_logprobs=3)
    tokens, sampled, prompt = _generate(model, params, steps=4, chunk=4)
    ref = _hf_logprobs(tiny_model_dir, PROMPT + tokens)  # [n, V]
    tol = TOLERANCE[dtype]
    for i, lp in enumerate(sampled):
        row = ref[len(PROMPT) - 1 + i]
        assert lp is not None and lp.token_id == tokens[i]
        assert abs(lp.logprob - float(row[tokens[i]])) < tol
        want = row.topk(5)
        assert torch.allclose(torch.tensor(lp.top_logprobs), want.values, atol=tol)
        if dtype == "float32":
            assert list(lp.top_ids) == want.indices.tolist()  # same order
    assert [p.token_id for p in prompt] == PROMPT[1:]
    for j, p in enumerate(prompt):
        assert abs(p.logprob - float(ref[j, PROMPT[j + 1]])) < tol
        assert len(p.top_ids) == 3


def test_sampled_logprobs_are_raw_before_temperature_and_bias(tiny_model_dir: Path) -> None:
    """vLLM's raw_logprobs: temperature, top-k and bias change the draw, not the log-probs."""
    model = models.load(tiny_model_dir, dtype="float32", layers_per_group=2)
    plain = _generate(model, SamplingParams(temperature=0.0, logprobs=2), 1, 99)[1][0]
    odd = SamplingParams(temperature=0.0, logprobs=2, logit_bias=((PROMPT[0], 50.0),))
    tokens, [biased], _ = _generate(model, odd, 1, 99)
    assert plain is not None and biased is not None and tokens == [PROMPT[0]]
    assert biased.top_ids == plain.top_ids and biased.top_logprobs == plain.top_logprobs
    ref = _hf_logprobs(tiny_model_dir, PROMPT)[-1]
    assert abs(biased.logprob - float(ref[PROMPT[0]])) < 1e-3


class _Only:
    """A constraint that allows one token."""

    def __init__(self, token: int, vocab_size: int) -> None:
        self._banned = torch.ones(vocab_size, dtype=torch.bool)
        self._banned[token] = False

    def banned(self) -> torch.Tensor:
        return self._banned


def test_sampled_logprobs_are_raw_before_a_grammar_s_mask(tiny_model_dir: Path) -> None:
    """A structured-output mask changes the draw, not the log-probs (it masks in place)."""
    model = models.load(tiny_model_dir, dtype="float32", layers_per_group=2)
    kv = model.new_kv_cache(8, BLOCK)
    table = kv.allocator.allocate(4)
    params = SamplingParams(temperature=0.0, logprobs=2)
    only = _Only(PROMPT[0], model.config.vocab_size)
    seq = SeqSpec("a", PROMPT, 0, table, sample=True, sampling=params, constraint=only)
    tokens, [lp], _ = unpack(run_chain(model, build_batch([seq], BLOCK, model.device), kv))
    ref = _hf_logprobs(tiny_model_dir, PROMPT)[-1]  # [V]
    assert tokens == [PROMPT[0]] and lp is not None
    assert abs(lp.logprob - float(ref[PROMPT[0]])) < 1e-3
    assert list(lp.top_ids) == ref.topk(2).indices.tolist()


def test_a_batch_without_logprobs_gets_the_plain_tensor(tiny_model_dir: Path) -> None:
    model = models.load(tiny_model_dir, dtype="float32", layers_per_group=2)
    kv = model.new_kv_cache(8, BLOCK)
    table = kv.allocator.allocate(4)
    plain = SeqSpec("a", PROMPT, 0, table, sample=True, sampling=SamplingParams(temperature=0))
    out = run_chain(model, build_batch([plain], BLOCK, model.device), kv)
    assert isinstance(out, torch.Tensor) and out.shape == (1,)
    asks = SeqSpec("a", PROMPT, 0, table, sample=True,
                   sampling=SamplingParams(temperature=0, logprobs=0))
    both = run_chain(model, build_batch([asks], BLOCK, model.device), kv)
    assert isinstance(both, HeadOutput) and both.tolist() == out.tolist()
    assert both.logprobs[0] is not None and both.logprobs[0].top_ids == ()


def test_logprobs_out_of_range_are_refused() -> None:
    with pytest.raises(ValueError, match="logprobs"):
        SamplingParams(logprobs=21)
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=-1)
