"""Requests timed through the operator chain alone (`timed_request`, `python -m models direct`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

import models
from models.generate import generate, timed_request
from models.sampling_params import SamplingParams

PROMPT = [5, 17, 42, 99, 17, 5, 300, 8]


def test_timed_request_first_token_then_the_rest(tiny_model_dir: Path) -> None:
    model = models.load(tiny_model_dir, dtype="float32")
    first, total = timed_request(model, [1, 2, 3, 4, 5], max_tokens=4)
    assert 0 < first < total
    one_first, one_total = timed_request(model, [1, 2, 3], max_tokens=1)
    assert 0 < one_first <= one_total


def test_direct_cli_times_each_case(tiny_model_dir: Path, tmp_path: Path) -> None:
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps([{"prompt": "hello world", "max_tokens": 1, "case": [2, 1]},
                                 {"prompt": "a longer prompt here", "max_tokens": 3}]))
    out = subprocess.run([sys.executable, "-m", "models", "direct", "--model",
                          str(tiny_model_dir), "--dtype", "float32", "--cases", str(cases),
                          "--repeats", "2"], check=True, capture_output=True, text=True,
                         timeout=300)
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["dtype"] == "torch.float32" and doc["threads"] == 1 and "GEMM" in doc["kernels"]
    first, second = doc["cases"]
    assert first["case"] == [2, 1] and first["prompt_tokens"] > 0
    for c in (first, second):
        assert len(c["ttft_s"]) == len(c["total_s"]) == 2
        assert all(0 < t <= total for t, total in zip(c["ttft_s"], c["total_s"], strict=True))
        assert c["median_ttft_s"] <= c["median_total_s"]


@pytest.mark.parametrize("folder", ["tiny_model_dir", "default_model_dir"])
def test_greedy_repetition_penalty_matches_transformers_generate(
        folder: str, request: pytest.FixtureRequest) -> None:
    path: Path = request.getfixturevalue(folder)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    model = models.load(path, dtype="float32")
    eos = hf.generation_config.eos_token_id
    mask = torch.ones(1, len(PROMPT), dtype=torch.long)
    got: dict[float, list[int]] = {}
    for penalty in (1.0, 1.3):
        with torch.no_grad():
            out = hf.generate(torch.tensor([PROMPT]), attention_mask=mask, max_new_tokens=24,
                              do_sample=False, repetition_penalty=penalty)
        params = SamplingParams(temperature=0, max_tokens=24, repetition_penalty=penalty,
                                stop_token_ids=(eos,))
        got[penalty] = generate(model, PROMPT, params).token_ids
        assert got[penalty] == out[0, len(PROMPT):].tolist(), penalty
    assert got[1.3] != got[1.0]  # the penalty changed the output


def _openai_greedy(hf: torch.nn.Module, prompt: list[int], n: int, presence: float,
                   frequency: float, bias: dict[int, float]) -> list[int]:
    """Greedy tokens with the bias and OpenAI's penalties applied to transformers' logits."""
    ids, out = list(prompt), []
    for _ in range(n):
        with torch.no_grad():
            logits = hf(torch.tensor([ids])).logits[0, -1].float()  # [V]
        for token, b in bias.items():
            logits[token] += b
        for token in set(out):
            logits[token] -= presence + frequency * out.count(token)
        out.append(int(logits.argmax()))
        ids.append(out[-1])
    return out


def test_greedy_presence_frequency_and_bias_match_a_plain_loop(tiny_model_dir: Path) -> None:
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    model = models.load(tiny_model_dir, dtype="float32")
    bias = {8: -100.0, 300: 3.0}
    want = _openai_greedy(hf, PROMPT, 16, 1.5, 0.5, bias)
    params = SamplingParams(temperature=0, max_tokens=16, presence_penalty=1.5,
                            frequency_penalty=0.5, logit_bias=tuple(bias.items()))
    got = generate(model, PROMPT, params).token_ids
    assert got == want and 8 not in got
    assert len(set(got)) > 2  # the penalties made it move on
