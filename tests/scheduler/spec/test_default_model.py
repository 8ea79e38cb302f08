"""Greedy parity with and without speculation on the default model, fp32 and bf16, k = 5, with
code prompts whose answers repeat them (so drafts are accepted): stdlib functions asked back
with a change, and the code-edit workload's prompts (`loadgen.codeedit`).

NOTE: bf16 holds token for token because a verify step's rows compute what one-row steps
do, bit for bit (`models.batch.Batch.row_invariant`; tests/models/test_verify_rows.py), with
the native GEMV tuned for one row only (`one_row_gemv`: more rows take the GEMMs). Each
prompt is first run for one token, so that the plain run and the speculating one both find its
full blocks in the prefix cache: a prompt prefilled in full and one prefilled from a cached
prefix round differently in bf16 (the rest is a prefill of other rows), with or without
drafts (two plain runs of the owls prompt parted at token 95 that way)."""

from __future__ import annotations

import inspect
import textwrap
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from executors.types import Device, Priority
from loadgen.codeedit import code_edit_prompts
from models.sampling_params import SamplingParams
from models.spec_config import SpecConfig
from scheduler.api import Request
from scheduler.config import SchedulerConfig
from scheduler.scheduler import Scheduler
from tests.models.test_verify_rows import one_row_gemv
from tests.scheduler.conftest import xfer_time

SPEC = SpecConfig(num_speculative_tokens=5, prompt_lookup_max=4, prompt_lookup_min=2)
NUM_CODE_EDITS = 8


def _flat_time(device: str, name: str, shape: object) -> float:
    return 1e-3


def _code_prompts(tok: AutoTokenizer) -> list[list[int]]:
    """Chat prompts asking for stdlib functions back with one change."""
    out = []
    for fn, change in ((textwrap.dedent, "rename `text` to `source`"),
                       (textwrap.indent, "add a docstring line"),
                       (inspect.cleandoc, "rename `lines` to `rows`")):
        code = inspect.getsource(fn)[:900]
        messages = [{"role": "user", "content": f"Return this code with one change: {change}."
                                                f"\n\n```python\n{code}```"}]
        out.append(messages)
    out.append([{"role": "user", "content": "Tell me about owls."}])
    out += [[{"role": "user", "content": p.content}] for p in code_edit_prompts(NUM_CODE_EDITS)]
    return [tok(tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False)).input_ids
            for m in out]


async def _tokens(sched: Scheduler, rid: str, prompt: list[int],
                  spec: SpecConfig | None, max_tokens: int = 128) -> list[int]:
    greedy = SamplingParams(temperature=0, max_tokens=max_tokens, stop_token_ids=(2,))
    return [ev.token_id async for ev in sched.submit(
        Request(rid, "t", Priority.NORMAL, prompt, greedy, speculative=spec))
        if ev.token_id is not None]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
async def test_greedy_parity_on_code_prompts(default_model_dir: Path, dtype: str) -> None:
    model = one_row_gemv(default_model_dir, dtype)
    tok = AutoTokenizer.from_pretrained(default_model_dir)
    cfg = SchedulerConfig(policy="slice", max_model_len=2048, max_batch_tokens=1024)
    sched = Scheduler(model, [Device("cpu:0", 3 << 30)], "slice", _flat_time, xfer_time, cfg)
    await sched.start()
    try:
        for i, prompt in enumerate(_code_prompts(tok)):
            await _tokens(sched, f"w{i}", prompt, None, max_tokens=1)  # its blocks cached
            plain = await _tokens(sched, f"p{i}", prompt, None)
            spec = await _tokens(sched, f"s{i}", prompt, SPEC)
            assert spec == plain, (dtype, i, tok.decode(plain), tok.decode(spec))
    finally:
        await sched.stop()
    c = sched.spec_counters
    assert c.num_accepted_tokens >= 500, c  # the code answers were drafted, and kept
    assert len(c.accepted_per_pos) == SPEC.num_speculative_tokens and c.accepted_per_pos[-1], c
