"""`python -m models bench`: our operator chain vs transformers' forward, side by side.

Each case is timed for (a) the operator chain over paged KV and (b) the
transformers model's forward on the same inputs, interleaved a, b, a, b, ...
with the same dtype and thread count; medians over repeats.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, DynamicCache

from models.batch import Batch, SeqSpec, build_batch
from models.kv_cache import KVCache, blocks_for
from models.loader import Model, load
from models.sampling_params import SamplingParams

BLOCK = 16
GREEDY = SamplingParams(temperature=0.0)
PREFILLS = (128, 512)
DECODE_BATCHES = (1, 8, 32)


@dataclass(slots=True)
class Row:
    dtype: str
    case: str
    ours_s: float
    hf_s: float
    ratio: float
    tokens: int  # tokens the case produces (prefill: prompt tokens; decode: batch size)

    @property
    def ours_tok_s(self) -> float:
        return self.tokens / self.ours_s


@dataclass(slots=True)
class Case:
    name: str
    tokens: int
    ours: Callable[[], object]
    hf: Callable[[], object]
    per_op: Callable[[], list[float]]


def _contexts(batch: int) -> list[int]:
    """Mixed context lengths for a decode batch, spread over 64..512."""
    return [64 + (448 * i) // max(1, batch - 1) for i in range(batch)]


def _ours_batch(model: Model, kv: KVCache, lens_new: list[int], lens_past: list[int]) -> Batch:
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


def _per_op(model: Model, batch: Batch, kv: KVCache) -> list[float]:
    times, x = [], None
    for op in model.ops:
        t0 = time.perf_counter()
        x = op.run(batch, x, kv)
        times.append(time.perf_counter() - t0)
    return times


def _prefill_case(model: Model, hf: torch.nn.Module, kv: KVCache, n: int) -> Case:
    batch = _ours_batch(model, kv, [n], [0])
    ids = batch.input_ids[None]  # [1, n]

    def run_hf() -> None:
        with torch.inference_mode():
            hf(ids, use_cache=True, logits_to_keep=1)
    return Case(f"prefill {n}", n, lambda: _chain(model, batch, kv), run_hf,
                lambda: _per_op(model, batch, kv))


def _decode_case(model: Model, hf: torch.nn.Module, kv: KVCache, b: int) -> Case:
    ctx = _contexts(b)
    batch = _ours_batch(model, kv, [1] * b, ctx)
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
    return Case(f"decode b={b}", b, lambda: _chain(model, batch, kv), run_hf,
                lambda: _per_op(model, batch, kv))


def _median_pair(case: Case, repeats: int) -> tuple[float, float]:
    case.ours()
    case.hf()  # warm-up
    ours: list[float] = []
    hf: list[float] = []
    for _ in range(repeats):
        for fn, acc in ((case.ours, ours), (case.hf, hf)):
            t0 = time.perf_counter()
            fn()
            acc.append(time.perf_counter() - t0)
    return statistics.median(ours), statistics.median(hf)


def _median_ops(case: Case, repeats: int) -> list[float]:
    runs = [case.per_op() for _ in range(repeats)]
    return [statistics.median(col) for col in zip(*runs, strict=True)]


def bench_dtype(spec: str, dtype: str, repeats: int) -> tuple[list[Row], dict[str, list[float]]]:
    model = load(spec, dtype=dtype)
    hf = AutoModelForCausalLM.from_pretrained(model.path, dtype=model.dtype,
                                              attn_implementation="sdpa").eval()
    kv = model.new_kv_cache(blocks_for(512, BLOCK) * 40 + 64, BLOCK)
    for t in [*kv.keys.values(), *kv.values.values()]:
        t.normal_()  # NOTE: touch every page: untouched zero pages would make gathers cheap
    cases = [_prefill_case(model, hf, kv, n) for n in PREFILLS]
    cases += [_decode_case(model, hf, kv, b) for b in DECODE_BATCHES]
    rows, ops = [], {}
    for c in cases:
        ours, ref = _median_pair(c, repeats)
        rows.append(Row(dtype, c.name, ours, ref, ours / ref, c.tokens))
        ops[c.name] = _median_ops(c, repeats)
    return rows, ops


def _print_rows(rows: list[Row], threads: int) -> None:
    print(f"| dtype | case | ours ms | transformers ms | ratio | ours tok/s ({threads} thr) |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r.dtype} | {r.case} | {r.ours_s * 1e3:.1f} | {r.hf_s * 1e3:.1f} | "
              f"{r.ratio:.2f} | {r.ours_tok_s:.0f} |")


def _print_ops(names: list[str], ops: dict[str, dict[str, list[float]]]) -> None:
    print("\nper-operator median ms (ours)")
    for dtype, cases in ops.items():
        print(f"| {dtype} case | " + " | ".join(names) + " |")
        print("|---|" + "---:|" * len(names))
        for case, ts in cases.items():
            print(f"| {case} | " + " | ".join(f"{t * 1e3:.2f}" for t in ts) + " |")


def run(spec: str, dtypes: list[str], repeats: int, threads: int, json_path: Path | None) -> dict:
    torch.set_num_threads(threads)
    rows: list[Row] = []
    ops: dict[str, dict[str, list[float]]] = {}
    for dt in dtypes:
        r, o = bench_dtype(spec, dt, repeats)
        rows += r
        ops[dt] = o
    names = [o.name for o in load(spec, dtype=dtypes[0]).template.ops]
    _print_rows(rows, threads)
    _print_ops(names, ops)
    result = {"model": spec, "threads": threads, "repeats": repeats,
              "rows": [asdict(r) for r in rows], "op_names": names, "per_op_s": ops,
              "summary": _summary(rows, threads)}
    print("\n" + json.dumps(result["summary"], indent=1))
    if json_path:
        json_path.write_text(json.dumps(result, indent=1))
    return result


def _summary(rows: list[Row], threads: int) -> dict[str, object]:
    out: dict[str, object] = {"max_ratio": max(r.ratio for r in rows)}
    for dt in {r.dtype for r in rows}:
        by = {r.case: r for r in rows if r.dtype == dt}
        out[f"{dt}_decode_b32_over_b1"] = by["decode b=32"].ours_tok_s / by["decode b=1"].ours_tok_s
        out[f"{dt}_prefill_tok_s_per_core"] = {
            n: by[f"prefill {n}"].ours_tok_s / threads for n in PREFILLS}
    return out
