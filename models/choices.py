"""What kernels a model runs on this machine: plain data, measured by `models.tuning`.

Fast paths differ between CPUs (AMX, AVX512-BF16, AVX2 only) and dtypes, so
each field is a measured choice, never an assumption; `PORTABLE` is what
runs where nothing was measured (GPUs, and the reference in tests).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

GEMM_BACKENDS = ("aten", "onednn")
DECODE_KERNELS = ("sdpa", "matmul", "native")
NORM_ROPE_KERNELS = ("aten", "native")
DECODE_LAYERS = ("ops", "native")
PREFETCH = ("l1", "l2")
PREFILL_KERNELS = ("sdpa", "native", "amx")


@dataclass(frozen=True, slots=True)
class GemmChoice:
    """The GEMM backend of every linear layer (`models.linear`)."""

    backend: str = "aten"  # "aten": F.linear on plain weights | "onednn": pre-packed weights
    pack_rows: int | None = None  # onednn: the batch-size hint its weight layout is packed for
    native_rows: int = 0  # inputs of up to this many rows run the native GEMV instead
    prefetch: str = "l1"  # the native GEMV prefetches weight rows into L1 or L2 (gemv.c)
    # a half-precision model's GEMMs on float32 copies of its weights (inputs cast up,
    # outputs cast back): on a CPU without bf16 arithmetic that is faster (see linear.py)
    upcast: bool = False
    half_rows: int = 0  # upcast: inputs of up to this many rows run on the model-dtype weights

    def __post_init__(self) -> None:
        if self.backend not in GEMM_BACKENDS:
            raise ValueError(f"unknown GEMM backend {self.backend!r}")
        if self.prefetch not in PREFETCH:
            raise ValueError(f"unknown GEMV prefetch level {self.prefetch!r}")

    @property
    def few_rows(self) -> int:
        """Rows up to which inputs take a few-row path (the native GEMV, or `half_rows`)."""
        return max(self.native_rows, self.half_rows)

    @property
    def name(self) -> str:
        out = self.backend if self.pack_rows is None else f"{self.backend}@{self.pack_rows}"
        out += "+fp32" if self.upcast else ""
        out += f"+half<={self.half_rows}" if self.half_rows else ""
        native = f"+native<={self.native_rows}" if self.native_rows else ""
        return out + native + ("@l2" if native and self.prefetch == "l2" else "")


@dataclass(frozen=True, slots=True)
class LayerChoice:
    """Attention and elementwise kernels of the decoder layers (`models.layers`)."""

    matmul_max_scores: int = 0  # prefill: explicit matmuls up to n*C query-key pairs, else SDPA
    decode: str = "sdpa"  # decode attention: "sdpa" | "matmul" (both over gathered KV) | "native"
    norm_rope: str = "aten"  # RMSNorm and RoPE: "aten" ops | "native" one-pass kernels
    decode_layer: str = "ops"  # decode-only batches of few rows: "ops" | "native" (one call)
    pad_rows: int = 0  # layer groups run GEMMs on rows padded to a multiple of this (0: none)
    # prefill attention past the matmul limit: "sdpa" | "native" | "amx" (both paged, native.py)
    prefill: str = "sdpa"

    def __post_init__(self) -> None:
        if self.decode_layer not in DECODE_LAYERS:
            raise ValueError(f"unknown decode layer kernel {self.decode_layer!r}")
        if self.decode not in DECODE_KERNELS:
            raise ValueError(f"unknown decode attention {self.decode!r}")
        if self.norm_rope not in NORM_ROPE_KERNELS:
            raise ValueError(f"unknown norm/rope kernel {self.norm_rope!r}")
        if self.prefill not in PREFILL_KERNELS:
            raise ValueError(f"unknown prefill attention {self.prefill!r}")
        if self.pad_rows < 0:
            raise ValueError(f"pad_rows must be >= 0, got {self.pad_rows}")


_PREFILL_NAMES = {"sdpa": "SDPA", "native": "native", "amx": "AMX"}


@dataclass(frozen=True, slots=True)
class KernelChoice:
    """Which kernels a model's operators run on this machine."""

    gemm: GemmChoice = field(default_factory=GemmChoice)
    layer: LayerChoice = field(default_factory=LayerChoice)

    def describe(self) -> str:
        lay = self.layer
        return (f"GEMM {self.gemm.name}; prefill attention: matmuls up to "
                f"{lay.matmul_max_scores} scores, then {_PREFILL_NAMES[lay.prefill]}; "
                f"decode attention {lay.decode}; "
                f"norm and RoPE {lay.norm_rope}; decode layer {lay.decode_layer}; "
                f"rows padded to {lay.pad_rows or 'none'}")

    def to_dict(self) -> dict[str, Any]:
        g, lay = self.gemm, self.layer
        return {"gemm": {"backend": g.backend, "pack_rows": g.pack_rows,
                         "native_rows": g.native_rows, "upcast": g.upcast,
                         "half_rows": g.half_rows, "prefetch": g.prefetch},
                "layer": {"matmul_max_scores": lay.matmul_max_scores, "decode": lay.decode,
                          "norm_rope": lay.norm_rope, "decode_layer": lay.decode_layer,
                          "pad_rows": lay.pad_rows, "prefill": lay.prefill}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> KernelChoice:
        return cls(GemmChoice(**d["gemm"]), LayerChoice(**d["layer"]))


PORTABLE = KernelChoice()
