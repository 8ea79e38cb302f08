"""Floors for `python -m benchmarks.models chain`: the case's matmuls alone, and weight streaming.

GEMM floor of a case: the same matmuls as the operator chain, run back to
back with nothing between them, same dtype and threads: per decoder layer
the q/k/v, o, gate, up and down projections over the model's own weights at
the case's row count, the attention's two batched matmuls (scores over each
prefill's full n x n, or each decode batch's padded context; both at least
the work the chain does), and lm_head over the sampled rows. Each GEMM
backend (aten, oneDNN pre-packed, and the native GEMV at up to 8 rows) is
timed and the fastest one is the floor, so a slow backend choice cannot
flatter the ratio; for a half-precision model also every backend on float32
copies of the weights, inputs and attention (the `upcast` GEMMs' arithmetic).

Weight streaming: the bytes one decode step must read (every linear weight
and lm_head) divided by the bandwidth of a plain memory copy of that size,
counted as bytes read plus bytes written per second.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from benchmarks.harness import median_s
from models import native
from models.choices import PREFETCH, GemmChoice
from models.linear import Linear, onednn_available
from models.loader import Model
from models.ops import HeadOp, LayerGroupOp

NATIVE_MAX_ROWS = 8


@dataclass(slots=True)
class FloorWeights:
    """The model's linear weights in every layout a floor is timed with."""

    layers: dict[str, list[list[Linear]]]  # backend -> per layer [qkv, o, gate, up, down]
    head: dict[str, Linear]
    dtypes: dict[str, torch.dtype]  # backend -> the dtype its matmuls run in

    @classmethod
    def of(cls, model: Model) -> FloorWeights:
        plain = [w.linears() for op in model.ops if isinstance(op, LayerGroupOp)
                 for w in op.layers]
        head = next(op for op in model.ops if isinstance(op, HeadOp)).lm_head
        dtypes = [model.dtype] + ([torch.float32] if model.dtype != torch.float32 else [])
        choices = {k: (c, dt) for dt in dtypes for k, c in _choices(dt, dt != model.dtype)}
        layers = {k: [[_cast(lin, dt) for lin in lay] for lay in plain]
                  for k, (_, dt) in choices.items()}
        layers = {k: [[Linear.build(lin.plain(), lin.bias, c) for lin in lay]
                      for lay in layers[k]] for k, (c, _) in choices.items()}
        heads = {k: Linear.build(_cast(head, dt).plain(), None, c)
                 for k, (c, dt) in choices.items()}
        return cls(layers, heads, {k: dt for k, (_, dt) in choices.items()})


def _choices(dtype: torch.dtype, upcast: bool) -> list[tuple[str, GemmChoice]]:
    """(floor name, backend) of every backend for matmuls in `dtype`."""
    out = [("aten", GemmChoice("aten"))]
    if onednn_available(dtype):
        out.append(("onednn", GemmChoice("onednn")))
    if native.supports(dtype):
        out += [(f"native@{pf}", GemmChoice("aten", native_rows=NATIVE_MAX_ROWS, prefetch=pf))
                for pf in PREFETCH]
    return [(f"{k}+fp32" if upcast else k, c) for k, c in out]


def _cast(lin: Linear, dtype: torch.dtype) -> Linear:
    """A plain linear of `lin`'s weights in `dtype`."""
    bias = lin.plain_bias()
    return Linear(lin.plain().to(dtype), None if bias is None else bias.to(dtype), False)


@dataclass(frozen=True, slots=True)
class AttnShape:
    """The attention matmuls of one sequence group: [Hkv, G, rows, d] x [Hkv, G, d, C]."""

    groups: int  # sequences batched in one matmul (1 for a prefill)
    rows: int  # query rows per KV head and group (q heads per KV head x new tokens)
    context: int


def floor_fn(w: FloorWeights, backend: str, rows: int, sampled: int, attn: list[AttnShape],
             num_kv_heads: int, head_dim: int) -> Callable[[], None]:
    """The case's matmuls alone on one backend (in its dtype: see `FloorWeights.dtypes`)."""
    layers, head, dtype = w.layers[backend], w.head[backend], w.dtypes[backend]
    xs = {k: torch.randn(rows, k).to(dtype) for k in {lin.weight.shape[1] for lin in layers[0]}}
    h = torch.randn(sampled, head.weight.shape[1]).to(dtype)
    qs = [torch.randn(num_kv_heads, a.groups, a.rows, head_dim).to(dtype) for a in attn]
    ks = [torch.randn(num_kv_heads, a.groups, head_dim, a.context).to(dtype) for a in attn]
    ps = [torch.randn(num_kv_heads, a.groups, a.rows, a.context).to(dtype) for a in attn]
    vs = [torch.randn(num_kv_heads, a.groups, a.context, head_dim).to(dtype) for a in attn]

    def run() -> None:
        for lay in layers:
            for lin in lay:
                lin(xs[lin.weight.shape[1]])
            for q, k, p, v in zip(qs, ks, ps, vs, strict=True):
                torch.matmul(q, k)  # scores [Hkv, G, rows, C]
                torch.matmul(p, v)  # values [Hkv, G, rows, d]
        head(h)
    return run


def floor_backends(w: FloorWeights, rows: int) -> list[str]:
    return [k for k in w.layers if not k.startswith("native") or rows <= NATIVE_MAX_ROWS]


def streamed_bytes(model: Model) -> int:
    """Bytes of weights one decode step reads: every linear weight and lm_head."""
    total = 0
    for op in model.ops:
        if isinstance(op, LayerGroupOp):
            total += sum(_plain_bytes(lin) for w in op.layers for lin in w.linears())
        elif isinstance(op, HeadOp):
            total += _plain_bytes(op.lm_head)
    return total


def _plain_bytes(lin: Linear) -> int:
    n, k = lin.weight.shape
    bias = 0 if lin.bias is None else lin.bias.numel() * lin.bias.element_size()
    return n * k * lin.weight.element_size() + bias


def copy_bandwidth(num_bytes: int, repeats: int = 7) -> float:
    """Bytes read plus written per second by `dst.copy_(src)` of `num_bytes` (median)."""
    src = torch.ones(num_bytes, dtype=torch.uint8)
    dst = torch.zeros_like(src)
    dst.copy_(src)
    return 2 * num_bytes / median_s(lambda: dst.copy_(src), repeats)
