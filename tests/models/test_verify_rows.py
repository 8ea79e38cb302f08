"""A verify step's rows compute, bit for bit, what one-row decode steps of the same tokens do
(default model, fp32 and bf16): so greedy verification cannot part from plain decoding at a
near-tie. Prompts are the code-edit workload's (`loadgen.codeedit`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

import models
from loadgen.codeedit import code_edit_prompts
from models.batch import SeqSpec, build_batch
from models.generate import chain_logits
from models.kv_cache import KVCache, blocks_for
from models.linear import INVARIANT_ROWS
from models.loader import Model
from models.sampling_params import SamplingParams

BLOCK = 16
GREEDY = SamplingParams(temperature=0.0)
NUM_PROMPTS = 10


def one_row_gemv(model_dir: Path, dtype: str) -> Model:
    """The default model on this machine's tuned kernels, but with its native GEMV taking one
    row only, so that any verify step exceeds `native_rows` (tuned at 2 to 8 rows for this
    model on one CPU, from run to run): its rows must run the GEMV nonetheless."""
    tuned = models.load(model_dir, dtype=dtype).kernels
    choice = replace(tuned, gemm=replace(tuned.gemm, native_rows=min(1, tuned.gemm.native_rows)))
    return models.load(model_dir, dtype=dtype, kernel_choice=choice)


def _prompts(model_dir: Path) -> list[list[int]]:
    tok = AutoTokenizer.from_pretrained(model_dir)
    texts = [tok.apply_chat_template([{"role": "user", "content": p.content}],
                                     add_generation_prompt=True, tokenize=False)
             for p in code_edit_prompts(NUM_PROMPTS)]
    return [tok(t).input_ids for t in texts]


def _logits(model: Model, kv: KVCache, table: list[int], tokens: list[int], past: int,
            num_draft: int) -> torch.Tensor:
    seq = SeqSpec("r", tokens, past, table, sample=True, sampling=GREEDY, num_draft=num_draft)
    return chain_logits(model, build_batch([seq], BLOCK, model.device), kv)


def _verify_against_steps(model: Model, prompt: list[int], k: int) -> tuple[int, int]:
    """Prefill `prompt` but its last k + 1 tokens; score those as one verify step of k drafts
    and as k + 1 one-row steps -> (rows bit-identical, rows)."""
    kv = model.new_kv_cache(blocks_for(len(prompt), BLOCK), BLOCK)
    table = kv.allocator.allocate(blocks_for(len(prompt), BLOCK))
    past = len(prompt) - (k + 1)
    _logits(model, kv, table, prompt[:past], 0, 0)
    verify = _logits(model, kv, table, prompt[past:], past, k)  # [k + 1, V]
    steps = torch.cat([_logits(model, kv, table, [t], past + i, 0)
                       for i, t in enumerate(prompt[past:])])  # [k + 1, V]
    same = sum(torch.equal(verify[i], steps[i]) for i in range(k + 1))
    return same, k + 1


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_verify_rows_equal_one_row_steps(default_model_dir: Path, dtype: str) -> None:
    model = one_row_gemv(default_model_dir, dtype)
    assert model.kernels.gemm.native_rows == 1
    ks = (5, 3, 7, INVARIANT_ROWS - 1)  # the bench's k, a few others, the most drafts
    for i, prompt in enumerate(_prompts(default_model_dir)):
        k = ks[i % len(ks)]
        same, rows = _verify_against_steps(model, prompt, k)
        assert same == rows, (dtype, i, k, f"{same} of {rows} rows bit-identical")
