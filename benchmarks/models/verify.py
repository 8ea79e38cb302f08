"""`python -m benchmarks.models verify`: one speculative verify step of R rows (a request's
known token and R - 1 drafts) through the whole operator chain, two ways, interleaved,
medians: row-invariant (what runs: every row on the native GEMV a one-row step runs,
`models.batch.Batch.row_invariant`) and on the tuned GEMM backend (a copy of the model
whose native GEMV takes one row only: the path before wherever the rows exceed the tuned
`native_rows`, which rounds rows otherwise than one-row steps); beside them a one-row
decode step. Per way: the layer groups' and the head's milliseconds, and the whole step's.
"""

from __future__ import annotations

import time
from dataclasses import fields, replace
from pathlib import Path

import torch

from benchmarks.harness import capability_line, parser, print_table, write_json
from benchmarks.models.cases import BLOCK, GREEDY
from models.batch import Batch, SeqSpec, build_batch
from models.cpu import torch_threads
from models.kv_cache import KVCache, blocks_for
from models.loader import Model, load

ROWS = (2, 4, 5, 6, 8)  # 5-6: the GEMV's one-pass tile (models/csrc/gemv.c)
CONTEXT = 300  # tokens before the step


class _GemmRows(Batch):
    """A batch whose verify rows take the GEMMs above `native_rows` (the path before)."""

    __slots__ = ()

    @property
    def row_invariant(self) -> bool:
        return False


def _batch(model: Model, kv: KVCache, rows: int, table: list[int]) -> Batch:
    ids = [(7 * j) % 1000 + 5 for j in range(rows)]
    seq = SeqSpec("r", ids, CONTEXT, table, sample=True, sampling=GREEDY, num_draft=rows - 1)
    return build_batch([seq], BLOCK, model.device)


def _op_ms(model: Model, batch: Batch, kv: KVCache) -> list[float]:
    out, x = [], None
    for op in model.ops:
        t0 = time.perf_counter()
        x = op.run(batch, x, kv)
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def _medians(runs: list[list[float]]) -> dict[str, float]:
    per_op = [sorted(r[i] for r in runs)[len(runs) // 2] for i in range(len(runs[0]))]
    return {"layers": sum(per_op[1:-1]), "head": per_op[-1], "step": sum(per_op)}


def gemm_copy(spec: str, model: Model, threads: int) -> Model:
    """`model` again, its native GEMV limited to one row: more rows take its GEMMs."""
    k = model.kernels
    gemm = replace(k.gemm, native_rows=min(1, k.gemm.native_rows))
    return load(spec, dtype=model.dtype, threads=threads, kernel_choice=replace(k, gemm=gemm))


def measure(model: Model, gemm_model: Model, rows: int, repeats: int) -> dict[str, object]:
    """One case: the three ways, interleaved, after one warm-up of each."""
    kv = model.new_kv_cache(blocks_for(CONTEXT + max(ROWS), BLOCK) + 1, BLOCK)
    table = kv.allocator.allocate(blocks_for(CONTEXT + max(ROWS), BLOCK))
    verify = _batch(model, kv, rows, table)
    gemm = _GemmRows(**{f.name: getattr(verify, f.name) for f in fields(Batch)})
    ways = {"one row": (model, _batch(model, kv, 1, table)), "invariant": (model, verify),
            "gemm": (gemm_model, gemm)}
    runs: dict[str, list[list[float]]] = {k: [] for k in ways}
    for i in range(repeats + 1):
        for name, (m, b) in ways.items():
            ms = _op_ms(m, b, kv)
            if i:
                runs[name].append(ms)
    return {"rows": rows, **{name: _medians(r) for name, r in runs.items()}}


def run(spec: str, dtype: str, threads: int, repeats: int,
        out: Path | None) -> list[dict[str, object]]:
    print(f"CPU: {capability_line()}; {threads} thread(s); {dtype}; torch {torch.__version__}\n")
    model = load(spec, dtype=dtype, threads=threads)
    gemm_model = gemm_copy(spec, model, threads)
    print(f"kernels: {model.kernels.gemm.name}; gemm: {gemm_model.kernels.gemm.name}\n")
    with torch_threads(threads), torch.inference_mode():
        rows = [measure(model, gemm_model, r, repeats) for r in ROWS]
    print_table(["rows", "one row ms", "invariant ms", "gemm ms", "invariant / gemm",
                 "invariant layers / head", "gemm layers / head"], "rrrrrrr",
                (_cells(r) for r in rows))
    write_json(out, {"cpu": capability_line(), "threads": threads, "dtype": dtype,
                     "kernels": model.kernels.gemm.name, "gemm": gemm_model.kernels.gemm.name,
                     "rows": rows})
    return rows


def _cells(r: dict[str, object]) -> list[str]:
    one, inv, gemm = (r[k] for k in ("one row", "invariant", "gemm"))
    assert isinstance(one, dict) and isinstance(inv, dict) and isinstance(gemm, dict)
    return [str(r["rows"]), f"{one['step']:.2f}", f"{inv['step']:.2f}", f"{gemm['step']:.2f}",
            f"{inv['step'] / gemm['step']:.2f}", f"{inv['layers']:.2f} / {inv['head']:.2f}",
            f"{gemm['layers']:.2f} / {gemm['head']:.2f}"]


def main(argv: list[str] | None = None) -> list[dict[str, object]]:
    p = parser("python -m benchmarks.models verify", __doc__)
    p.add_argument("--model", default="default")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=15)
    a = p.parse_args(argv)
    return run(a.model, a.dtype, a.threads, a.repeats, a.json)
