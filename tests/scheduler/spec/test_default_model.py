"""Greedy parity with and without speculation on the default model, fp32 and bf16, with code
prompts whose answers repeat them (so drafts are accepted).

NOTE: in bf16 a step of at most `native_rows` rows runs the native GEMV and a larger one
oneDNN's GEMM, whose rounding differs (plain decoding shows it too, when a request shares
its step with others); a verify step of k + 1 rows is token for token a plain step's where
k + 1 <= native_rows (tuned per machine), so bf16 drafts that far."""

from __future__ import annotations

import inspect
import textwrap
from pathlib import Path

import pytest
from transformers import AutoTokenizer

import models
from executors.types import Device, Priority
from models.ops import LayerGroupOp
from models.sampling_params import SamplingParams
from models.spec_config import SpecConfig
from scheduler.api import Request
from scheduler.config import SchedulerConfig
from scheduler.scheduler import Scheduler
from tests.scheduler.conftest import xfer_time

SPEC = SpecConfig(num_speculative_tokens=5, prompt_lookup_max=4, prompt_lookup_min=2)


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
    return [tok(tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False)).input_ids
            for m in out]


def _bf16_spec(model: models.Model) -> SpecConfig:
    """Drafts within the native GEMV's rows (the module's NOTE), at least one."""
    rows = min(lin.native_rows for op in model.ops if isinstance(op, LayerGroupOp)
               for w in op.layers for lin in w.linears())
    return SpecConfig(max(1, rows - 1), 4, 2)


async def _tokens(sched: Scheduler, rid: str, prompt: list[int],
                  spec: SpecConfig | None) -> list[int]:
    greedy = SamplingParams(temperature=0, max_tokens=128, stop_token_ids=(2,))
    return [ev.token_id async for ev in sched.submit(
        Request(rid, "t", Priority.NORMAL, prompt, greedy, speculative=spec))
        if ev.token_id is not None]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
async def test_greedy_parity_on_code_prompts(default_model_dir: Path, dtype: str) -> None:
    model = models.load(default_model_dir, dtype=dtype)
    tok = AutoTokenizer.from_pretrained(default_model_dir)
    cfg = SchedulerConfig(policy="slice", max_model_len=2048, max_batch_tokens=1024)
    sched = Scheduler(model, [Device("cpu:0", 3 << 30)], "slice", _flat_time, xfer_time, cfg)
    config = SPEC if dtype == "float32" else _bf16_spec(model)
    await sched.start()
    try:
        for i, prompt in enumerate(_code_prompts(tok)):
            plain = await _tokens(sched, f"p{i}", prompt, None)
            spec = await _tokens(sched, f"s{i}", prompt, config)
            assert spec == plain, (dtype, i, tok.decode(plain), tok.decode(spec))
    finally:
        await sched.stop()
    c = sched.spec_counters
    assert c.num_accepted_tokens >= 100, c  # the code answers were drafted, and kept
