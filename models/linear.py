"""Linear layers on the GEMM backend chosen for this CPU, with fused epilogues.

`Linear` stores its weight once, in the layout of one backend:

- `aten`: the plain `[N, K]` weight through `F.linear` (MKL or oneDNN inside aten);
- `onednn`: the weight reordered once into oneDNN's blocked layout
  (`torch.ops.mkldnn._reorder_linear_weight`), run by `_linear_pointwise`,
  which also fuses SiLU, a multiply or a residual add into the GEMM's epilogue.
  `pack_rows` is the batch-size hint the layout is reordered for (None: oneDNN's
  default);
- inputs of at most `native_rows` rows (decode steps) run the native GEMV of
  `models.native` over a plain copy of the weight, epilogues fused likewise.

With `upcast`, a half-precision model's weight is kept as a float32 copy (exact:
every bf16 value is a float32 one) and any of the above runs in float32, the
input (and an epilogue's operand) cast up and the output cast back to the
model's dtype. On a CPU without bf16 arithmetic (AVX2 only), aten's bf16 GEMMs
ran 3-7x slower than float32 ones at 16-512 rows; on one with it, the bf16
GEMMs win. A decode step of a row or two streams the weights, and float32
weights are twice the bytes: inputs of up to `half_rows` rows run on a copy
in the model's dtype kept beside them (`half`; aten, or the native GEMV within
`native_rows`).

Which backend is fastest differs between CPUs (AMX, AVX512-BF16, AVX2 only)
and dtypes; `models.tuning` measures it at start-up.

Row-invariant calls (`invariant=True`: the rows of a speculative verify step) run,
up to `INVARIANT_ROWS` rows, whatever kernel a one-row input runs: where that is the
native GEMV, each row's result is bit for bit the one it would get alone (the GEMV's
sum for a row does not depend on the rows beside it; GEMMs' rounding does).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from models import native
from models.choices import GemmChoice

_mkldnn = torch.ops.mkldnn

ATEN = GemmChoice("aten")
# NOTE: a verify step of one request feeds at most 16 drafts and its known token; past this,
# a shared step's rows take the GEMMs (their rounding is a shared step's, as plain decoding's)
INVARIANT_ROWS = 17


def onednn_available(dtype: torch.dtype) -> bool:
    """oneDNN's packed linear exists in this torch build for `dtype` (pure check)."""
    if not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return dtype == torch.float32


@dataclass(slots=True)
class Linear:
    """`y = x @ W.T + b`. x: [..., K] -> [..., N]."""

    weight: torch.Tensor  # [N, K]: plain (aten) or oneDNN's opaque blocked tensor
    bias: torch.Tensor | None  # [N]
    packed: bool
    native_rows: int = 0  # inputs of up to this many rows run the native GEMV
    rows_major: torch.Tensor | None = None  # [N, K] plain, for the native GEMV when packed
    out_dtype: torch.dtype | None = None  # upcast: the model's dtype (weights are float32)
    half: Linear | None = None  # upcast: plain aten in the model's dtype, for few rows
    half_rows: int = 0  # upcast: inputs of up to this many rows run `half`
    prefetch: str = "l1"  # where the native GEMV prefetches weight rows (`GemmChoice`)

    @classmethod
    def build(cls, weight: torch.Tensor, bias: torch.Tensor | None,
              choice: GemmChoice = ATEN) -> Linear:
        """`weight` [N, K] laid out for `choice` (CPU only; elsewhere always aten)."""
        if weight.device.type != "cpu":
            return cls(weight, bias, False)
        out_dtype, half, pf = None, None, choice.prefetch
        if choice.upcast and weight.dtype != torch.float32:
            if choice.half_rows:  # NOTE: its rows within `native_rows` run the native GEMV
                half = cls(weight.contiguous(), bias, False, choice.native_rows, prefetch=pf)
            out_dtype, weight = weight.dtype, weight.float()
            bias = None if bias is None else bias.float()
        weight = weight.contiguous()
        half_rows = choice.half_rows if half is not None else 0
        if choice.backend != "onednn":
            return cls(weight, bias, False, choice.native_rows, None, out_dtype, half, half_rows,
                       pf)
        packed = _mkldnn._reorder_linear_weight(weight, choice.pack_rows)
        keep = weight if choice.native_rows else None
        return cls(packed, bias, True, choice.native_rows, keep, out_dtype, half, half_rows, pf)

    @property
    def upcast(self) -> bool:
        """Whether this runs a half-precision model's GEMMs on float32 weights."""
        return self.out_dtype is not None

    def _native(self, x: torch.Tensor) -> torch.Tensor | None:
        # the weight for the native GEMV when it takes `x`, else None
        if x.dim() != 2 or x.shape[0] > self.native_rows or x.stride(1) != 1:
            return None
        return self.row_major()

    def _run(self, x: torch.Tensor, epilogue: str, other: torch.Tensor | None) -> torch.Tensor:
        w = self._native(x)
        if w is not None:
            return native.linear(x, w, self.bias, epilogue, other, self.prefetch)
        if not self.packed:
            y = F.linear(x, self.weight, self.bias)
            if epilogue == "silu":
                return F.silu(y)
            return y if other is None else (y.mul_(other) if epilogue == "mul" else y.add_(other))
        if other is None:
            attr = "swish" if epilogue == "silu" else "none"
            return _mkldnn._linear_pointwise(x, self.weight, self.bias, attr, [], "")
        return _mkldnn._linear_pointwise.binary(x, other, self.weight, self.bias, epilogue)

    def _call(self, x: torch.Tensor, epilogue: str, other: torch.Tensor | None,
              invariant: bool = False) -> torch.Tensor:
        if invariant and x.dim() == 2 and x.stride(1) == 1:
            lin = self.gemv_for(x.shape[0], invariant=True)
            w = None if lin is None else lin.row_major()
            if lin is not None and w is not None:
                return native.linear(x, w, lin.bias, epilogue, other, lin.prefetch)
        if self.out_dtype is None:
            return self._run(x, epilogue, other)
        if self.half is not None and x.dim() == 2 and x.shape[0] <= self.half_rows:
            return self.half._run(x, epilogue, other)
        y = self._run(x.float(), epilogue, None if other is None else other.float())
        return y.to(self.out_dtype)

    def __call__(self, x: torch.Tensor, invariant: bool = False) -> torch.Tensor:
        """x @ W.T + b; `invariant`: each row as a one-row input computes it (module doc)."""
        return self._call(x, "none", None, invariant)

    def silu(self, x: torch.Tensor, invariant: bool = False) -> torch.Tensor:
        """silu(x @ W.T + b)."""
        return self._call(x, "silu", None, invariant)

    def mul(self, x: torch.Tensor, other: torch.Tensor, invariant: bool = False) -> torch.Tensor:
        """(x @ W.T + b) * other, as a new tensor (`other` is left alone)."""
        return self._call(x, "mul", other, invariant)

    def add(self, x: torch.Tensor, other: torch.Tensor, invariant: bool = False) -> torch.Tensor:
        """(x @ W.T + b) + other, as a new tensor (`other` is left alone)."""
        return self._call(x, "add", other, invariant)

    def gemv_for(self, rows: int, invariant: bool = False) -> Linear | None:
        """The linear whose native GEMV takes `rows` rows on weights of the model's dtype:
        this one, or its `half` copy when upcast (None where neither does). `invariant`:
        up to `INVARIANT_ROWS` rows, the one a single row takes, whatever `native_rows`."""
        if invariant and rows <= INVARIANT_ROWS:
            rows = 1
        if self.out_dtype is None:
            return self if rows <= self.native_rows else None
        if self.half is None or rows > self.half_rows:
            return None
        return self.half.gemv_for(rows)

    def row_major(self) -> torch.Tensor | None:
        """The plain [N, K] weight the native GEMV reads, if it is kept (no copy)."""
        return self.rows_major if self.packed else self.weight

    def plain(self) -> torch.Tensor:
        """The weight as a plain [N, K] tensor in the model's dtype (a copy when packed or
        upcast)."""
        w = self.weight.to_dense() if self.packed else self.weight
        return w if self.out_dtype is None else w.to(self.out_dtype)

    def plain_bias(self) -> torch.Tensor | None:
        """The bias in the model's dtype."""
        b = self.bias
        return b if b is None or self.out_dtype is None else b.to(self.out_dtype)

    def to(self, device: torch.device) -> Linear:
        """On another device, as a plain `aten` linear in the model's dtype."""
        bias = self.plain_bias()
        return Linear(self.plain().to(device), None if bias is None else bias.to(device), False)

    @property
    def nbytes(self) -> int:
        """Bytes held: the weight (twice when a plain copy is kept for the GEMV; float32 when
        upcast, plus the model-dtype copy for few rows) and bias."""
        w = self.weight
        n = w.shape[0] * w.shape[1] * w.element_size() * (2 if self.rows_major is not None else 1)
        n += 0 if self.half is None else self.half.nbytes
        return n + (0 if self.bias is None else self.bias.numel() * self.bias.element_size())
