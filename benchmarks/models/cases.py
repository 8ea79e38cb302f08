"""The cases of `python -m benchmarks.models chain`: each as ours, transformers' and its GEMM
floor.

A prefill case is one fresh prompt of n tokens; a decode case is one step of
B sequences with mixed context lengths 64..512 over a paged cache whose every
page was touched (untouched zero pages would make gathers cheap).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from benchmarks.models.floor import AttnShape, FloorWeights, floor_backends, floor_fn
from models.batch import Batch, SeqSpec, build_batch
from models.kv_cache import KVCache, blocks_for
from models.loader import Model
from models.sampling_params import SamplingParams

BLOCK = 16
GREEDY = SamplingParams(temperature=0.0)


@dataclass(slots=True)
class Case:
    name: str
    tokens: int  # tokens the case produces (prefill: prompt tokens; decode: batch size)
    ours: Callable[[], object]
    hf: Callable[[], object]
    floors: dict[str, Callable[[], object]]  # GEMM backend -> the case's matmuls alone
    per_op: Callable[[], list[float]]


def contexts(batch: int) -> list[int]:
    """Mixed context lengths for a decode batch, spread over 64..512."""
    return [64 + (448 * i) // max(1, batch - 1) for i in range(batch)]


def ours_batch(model: Model, kv: KVCache, lens_new: list[int], lens_past: list[int]) -> Batch:
    seqs = []
    for i, (n, past) in enumerate(zip(lens_new, lens_past, strict=True)):
        table = kv.allocator.allocate(blocks_for(n + past, BLOCK))
        ids = [(7 * i + j) % model.config.vocab_size for j in range(n)]
        seqs.append(SeqSpec(f"r{i}", ids, past, table, sample=True, sampling=GREEDY))
    return build_batch(seqs, BLOCK, model.device)


def _chain(model: Model, batch: Batch, kv: KVCache) -> None:
    x: torch.Tensor | None = None
    for op in model.ops:
        x = op.run(batch, x, kv)


def per_op_seconds(model: Model, batch: Batch, kv: KVCache) -> list[float]:
    times, x = [], None
    for op in model.ops:
        t0 = time.perf_counter()
        x = op.run(batch, x, kv)
        times.append(time.perf_counter() - t0)
    return times


def _floors(model: Model, w: FloorWeights, rows: int, sampled: int,
            attn: list[AttnShape]) -> dict[str, Callable[[], object]]:
    c = model.config
    return {b: floor_fn(w, b, rows, sampled, attn, c.num_kv_heads, c.head_dim)
            for b in floor_backends(w, rows)}


def prefill_case(model: Model, hf: torch.nn.Module, kv: KVCache, w: FloorWeights, n: int) -> Case:
    batch = ours_batch(model, kv, [n], [0])
    ids = batch.input_ids[None]  # [1, n]
    g = model.config.num_heads // model.config.num_kv_heads

    def run_hf() -> None:
        with torch.inference_mode():
            hf(ids, use_cache=True, logits_to_keep=1)
    return Case(f"prefill {n}", n, lambda: _chain(model, batch, kv), run_hf,
                _floors(model, w, n, 1, [AttnShape(1, g * n, n)]),
                lambda: per_op_seconds(model, batch, kv))


def decode_case(model: Model, hf: torch.nn.Module, kv: KVCache, w: FloorWeights, b: int) -> Case:
    ctx = contexts(b)
    batch = ours_batch(model, kv, [1] * b, ctx)
    lmax = max(ctx)
    # transformers: left-padded cache of the same contexts, then one decode step
    mask = torch.zeros(b, lmax + 1, dtype=torch.long)
    for i, c in enumerate(ctx):
        mask[i, lmax - c:] = 1
    with torch.inference_mode():
        cache = DynamicCache(config=hf.config)  # type: ignore[arg-type]
        hf(torch.ones(b, lmax, dtype=torch.long), attention_mask=mask[:, :-1],
           past_key_values=cache, use_cache=True, logits_to_keep=1)
    pos = torch.tensor(ctx)[:, None]

    def run_hf() -> None:
        with torch.inference_mode():
            hf(batch.input_ids[:, None], attention_mask=mask, position_ids=pos,
               past_key_values=cache, use_cache=True, logits_to_keep=1)
            cache.crop(-1)  # drop the step just appended
    g = model.config.num_heads // model.config.num_kv_heads
    padded = blocks_for(lmax + 1, BLOCK) * BLOCK
    return Case(f"decode b={b}", b, lambda: _chain(model, batch, kv), run_hf,
                _floors(model, w, b, b, [AttnShape(b, g, padded)]),
                lambda: per_op_seconds(model, batch, kv))
