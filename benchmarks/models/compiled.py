"""`python -m benchmarks.models compiled`: a layer group through `torch.compile` against the
tuned chain.

inductor (its CPU C++ backend, weights frozen into the graph) compiles the
decoder layers of the first layer group for one fixed batch, on the portable
kernels it can trace (aten linear, SDPA, aten norm and RoPE; oneDNN's packed
weights and the native kernels are opaque to it), and the same batch then
runs three ways, interleaved, medians: the tuned operator (`models.tuning`'s
choice for this CPU), the portable operator eagerly, and the compiled one.
The compile time is printed too: a start-up candidate must compile within a
bounded time, once per shape it runs (`dynamic=False`), or once with dynamic
shapes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch._inductor.config as inductor_config

from benchmarks.harness import capability_line, parser, print_table, write_json
from benchmarks.models.cases import BLOCK, ours_batch
from models.choices import PORTABLE
from models.cpu import torch_threads
from models.kv_cache import KVCache, blocks_for
from models.layers import decoder_layer, rope_cos_sin
from models.loader import Model, load
from models.ops import LayerGroupOp
from models.probes import median_ms

CASES = (("prefill", 128), ("prefill", 512), ("decode", 1))
DECODE_CONTEXT = 300


def _group(model: Model) -> LayerGroupOp:
    return next(op for op in model.ops if isinstance(op, LayerGroupOp))


def _case(tuned: Model, plain: Model, kv: KVCache, kind: str, n: int,
          repeats: int) -> dict[str, float | str | int]:
    batch = (ours_batch(tuned, kv, [n], [0]) if kind == "prefill"
             else ours_batch(tuned, kv, [1] * n, [DECODE_CONTEXT] * n))
    g_t, g_p = _group(tuned), _group(plain)
    x = torch.randn(batch.input_ids.shape[0], tuned.config.hidden_size).to(tuned.dtype)
    cos, sin = rope_cos_sin(batch.positions, g_p.inv_freq, g_p.rope_scale, x.dtype)

    def layers(y: torch.Tensor) -> torch.Tensor:
        for i, w in zip(g_p.template.layers, g_p.layers, strict=True):
            y = decoder_layer(y, w, g_p.dims, cos, sin, batch, kv, i, g_p.layer)
        return y
    compiled = torch.compile(layers, dynamic=False)
    t0 = time.perf_counter()
    compiled(x)
    compile_s = time.perf_counter() - t0
    fns: dict[str, Callable[[], object]] = {
        "tuned": lambda: g_t.run(batch, x, kv), "portable": lambda: g_p.run(batch, x, kv),
        "compiled": lambda: compiled(x)}
    ms = median_ms(fns, repeats)
    for s in batch.seqs:
        kv.allocator.free(list(s.block_table))
    return {"case": f"{kind} {n}", "compile_s": compile_s, **ms}


def compare(spec: str, threads: int, repeats: int,
            cases: tuple[tuple[str, int], ...] = CASES) -> list[dict[str, float | str | int]]:
    """Per case: ms of the first layer group tuned, portable eager and compiled."""
    tuned = load(spec, dtype="bfloat16", threads=threads)
    plain = load(spec, dtype="bfloat16", kernel_choice=PORTABLE)
    need = max(n + 1 if k == "prefill" else n * (DECODE_CONTEXT + 1) for k, n in cases)
    kv = tuned.new_kv_cache(blocks_for(need, BLOCK) + len(cases), BLOCK)
    with torch_threads(threads), torch.inference_mode(), inductor_config.patch(freezing=True):
        return [_case(tuned, plain, kv, k, n, repeats) for k, n in cases]


def run(spec: str, threads: int, repeats: int, out: Path | None) -> list[dict[str, object]]:
    print(f"CPU: {capability_line()}; {threads} thread(s); bfloat16; torch {torch.__version__}\n")
    rows = compare(spec, threads, repeats)
    print_table(["case", "tuned ms", "portable eager ms", "compiled ms", "compiled / tuned",
                 "compile s"], "lrrrrr", (_cells(r) for r in rows))
    write_json(out, {"cpu": capability_line(), "threads": threads, "rows": rows})
    return [dict(r) for r in rows]


def _cells(r: dict[str, float | str | int]) -> list[str]:
    t, p, c = float(r["tuned"]), float(r["portable"]), float(r["compiled"])
    return [str(r["case"]), f"{t:.2f}", f"{p:.2f}", f"{c:.2f}", f"{c / t:.2f}",
            f"{float(r['compile_s']):.1f}"]


def main(argv: list[str] | None = None) -> list[dict[str, object]]:
    p = parser("python -m benchmarks.models compiled", __doc__)
    p.add_argument("--model", default="default")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=7)
    a = p.parse_args(argv)
    return run(a.model, a.threads, a.repeats, a.json)
