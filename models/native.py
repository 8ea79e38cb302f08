"""Native CPU kernels (`models/csrc/*.c`): compiled for this CPU on first use, called via ctypes.

The C sources need no torch headers, so one `cc -O3 -march=native` run
builds them in about a second; the library is cached under
`cache_root()/native`, keyed by the sources, compiler, flags and CPU. Where no
C compiler works, `library()` is None (logged once, `note()` says why) and
`models.tuning` never picks these kernels, recording that they were off.
`$SLICEGATE_NATIVE_MARCH` builds for another `-march` than `native` (tests
use it to run the AVX2-only code on an AVX512 machine). ctypes releases the
GIL around each call, so executor threads run them side by side.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from models.cpu import cpu_caps
from models.default_model import cache_root
from models.steps import startup_step

logger = logging.getLogger(__name__)

SOURCES = ("gemv.c", "norm_rope.c", "decode_attn.c", "prefill_attn.c", "prefill_amx.c",
           "decode_layer.c")
CFLAGS = ("-O3", "-fPIC", "-shared", "-std=gnu11", "-Wno-psabi")
_X86 = ("x86_64", "amd64", "i686", "i386")
_CSRC = Path(__file__).parent / "csrc"
EPILOGUES = {"none": 0, "silu": 1, "mul": 2, "add": 3}
PREFETCH_LEVELS = {"l1": 0, "l2": 1}  # where the GEMV prefetches weight rows (csrc/gemv.c)
_SUFFIX = {torch.bfloat16: "bf16", torch.float32: "f32"}

_P, _I64, _INT, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
_SIGNATURES = {
    "gemv": [_P, _I64, _P, _P, _P, _I64, _P, _I64, _I64, _I64, _I64, _INT, _INT],
    "rms_norm": [_P, _I64, _P, _P, _I64, _I64, _I64, _F],
    "rope": [_P, _I64, _P, _P, _I64, _I64, _I64],
    "rope_write": [_P, _I64, _P, _P, _I64, _I64, _I64, _I64, _P, _P, _I64, _I64, _P],
    "decode_attn": [_P, _I64, _P, _P, _I64, _I64, _I64, _I64, _P, _I64, _P, _P, _I64, _I64,
                    _I64, _F],
    "prefill_attn": [_P, _I64, _P, _P, _I64, _I64, _I64, _I64, _P, _I64, _I64, _P, _I64, _I64,
                     _F],
    "decode_layer": [_P, _P, _I64, _I64, _I64, _I64, _I64, _I64, _P, _P, _F, _P, _P, _P, _P, _P,
                     _P, _P, _P, _P, _P, _P, _I64, _I64, _P, _P, _I64, _P, _INT],
}
_ONE_BUILD = {"prefill_amx_bf16": _SIGNATURES["prefill_attn"], "amx_ready": []}  # not per dtype


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def cflags() -> list[str]:
    """The compiler flags: tuned for this CPU (`-march=native`, 512-bit vectors on x86)."""
    march = os.environ.get("SLICEGATE_NATIVE_MARCH") or "native"
    wide = ["-mprefer-vector-width=512"] if platform.machine().lower() in _X86 else []
    return [*CFLAGS, f"-march={march}", *wide]


def _digest(cc: str, sources: Sequence[Path], flags: Sequence[str]) -> str:
    h = hashlib.sha256()
    for path in sources:
        h.update(path.read_bytes())
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30,
                             check=True)
    h.update(version.stdout.encode() + " ".join(flags).encode() + cpu_caps().line().encode())
    return h.hexdigest()[:16]


def _build(cc: str, sources: Sequence[Path], flags: Sequence[str], target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = Path(tmp) / target.name
        cmd = [cc, *flags, *(str(s) for s in sources if s.suffix == ".c"), "-lm", "-o", str(out)]
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
        out.replace(target)  # NOTE: atomic, so a concurrent loader sees all or nothing


def _compiled(name: str, sources: Sequence[Path], flags: Sequence[str]) -> tuple[Path, str, bool]:
    """The library's path (built now if not cached), its cache key, whether it was built."""
    cc = _compiler()
    if cc is None:
        raise OSError("no C compiler (cc, gcc or $CC)")
    digest = _digest(cc, sources, flags)
    path = cache_root() / "native" / f"{name}-{digest}.so"
    built = not path.is_file()
    if built:
        with startup_step(logger, f"compiling the native library {name} for this CPU",
                          f"once; cached in {path}"):
            _build(cc, sources, flags, path)
    return path, digest, built


def load_library(name: str, sources: Sequence[Path], flags: Sequence[str],
                 bind: Callable[[ctypes.CDLL], ctypes.CDLL], what: str
                 ) -> tuple[ctypes.CDLL | None, str, str]:
    """A shared library of the C files among `sources` (headers: listed for the cache key),
    built with `flags` for this machine and cached under `cache_root()/native`, keyed by
    the sources, compiler, flags and CPU; `bind` declares its functions. Returns it with a
    note (how it was built, or why it is off) and its cache key; where no C compiler works,
    None, the reason (logged: "`what` off: ...") and ""."""
    try:
        path, digest, built = _compiled(name, sources, flags)
        lib = bind(ctypes.CDLL(str(path)))
    except (OSError, subprocess.SubprocessError, AttributeError) as e:
        detail = getattr(e, "stderr", "") or ""
        logger.warning("%s off: %s %s", what, e, detail[-2000:])
        return None, f"off: {e}"[:300], ""
    note = f"{'built' if built else 'cached'} with {_compiler()} {' '.join(flags)}: {path}"
    return lib, note, digest


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    for base, argtypes in _SIGNATURES.items():
        for suffix in _SUFFIX.values():
            fn = getattr(lib, f"{base}_{suffix}")
            fn.argtypes, fn.restype = argtypes, _INT
    for name, argtypes in _ONE_BUILD.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, _INT
    return lib


@functools.cache
def _load() -> tuple[ctypes.CDLL | None, str, str]:
    sources = [_CSRC / name for name in (*SOURCES, "common.h", "kernels.h")]
    return load_library("kernels", sources, cflags(), _bind, "native CPU kernels are")


def library() -> ctypes.CDLL | None:
    """The kernels built for this machine, or None where they cannot be built."""
    return _load()[0]


def note() -> str:
    """Whether the native kernels are on here: how they were built, or why they are off."""
    return _load()[1]


def build_id() -> str:
    """Which build of the kernels runs here (a digest of their sources, compiler, flags and
    CPU), or "" where they are off: timings taken with one build do not hold for another."""
    return _load()[2]


def supports(dtype: torch.dtype) -> bool:
    """Native kernels exist here for `dtype` (pure check; builds the library once)."""
    return dtype in _SUFFIX and library() is not None


@functools.cache
def _fn(base: str, dtype: torch.dtype) -> Any:
    lib = library()
    assert lib is not None, "native kernels are not available on this machine"
    return getattr(lib, f"{base}_{_SUFFIX[dtype]}")


def _ok(rc: int, what: str) -> None:
    if rc != 0:
        raise RuntimeError(f"native {what} failed with code {rc}")


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, epilogue: str = "none",
           other: torch.Tensor | None = None, prefetch: str = "l1") -> torch.Tensor:
    """epi(x @ w.T + bias) for a few rows. x: [M, K] (rows unit-stride); w: [N, K] contiguous;
    `prefetch`: the cache level weight rows are prefetched into (`PREFETCH_LEVELS`)."""
    m, k = x.shape
    n = w.shape[0]
    assert x.stride(1) == 1 and w.is_contiguous() and x.dtype == w.dtype
    y = torch.empty(m, n, dtype=x.dtype)  # [M, N]
    if other is not None:
        assert other.stride(1) == 1 and other.shape == (m, n)
    _ok(_fn("gemv", x.dtype)(
        x.data_ptr(), x.stride(0), w.data_ptr(), None if bias is None else bias.data_ptr(),
        y.data_ptr(), n, None if other is None else other.data_ptr(),
        0 if other is None else other.stride(0), m, n, k, EPILOGUES[epilogue],
        PREFETCH_LEVELS[prefetch]), "gemv")
    return y


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # x: [T, D] (rows unit-stride) -> [T, D]
    t, d = x.shape
    assert x.stride(1) == 1 and weight.is_contiguous()
    y = torch.empty(t, d, dtype=x.dtype)
    _ok(_fn("rms_norm", x.dtype)(x.data_ptr(), x.stride(0), weight.data_ptr(), y.data_ptr(), d,
                                 t, d, eps), "rms_norm")
    return y


def rope_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE in place. x: [T, heads, d] (heads and d contiguous); cos, sin: [T, 1, d] contiguous."""
    t, heads, d = x.shape
    assert x.stride(2) == 1 and x.stride(1) == d and cos.is_contiguous() and sin.is_contiguous()
    _ok(_fn("rope", x.dtype)(x.data_ptr(), x.stride(0), cos.data_ptr(), sin.data_ptr(), t, heads,
                             d), "rope")
    return x


def rope_write_(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: tuple[int, int],
                keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor) -> None:
    """RoPE on q and k inside a fused q/k/v output, in place, then k and v into the cache.

    qkv: [T, (H + 2*Hkv) * d] (rows unit-stride); cos, sin: [T, 1, d] contiguous;
    heads: (H, Hkv); keys, values: [Hkv, num_blocks, bs, d] contiguous; slots: [T] int64.
    """
    t = qkv.shape[0]
    h, hkv = heads
    hk, nblocks, bs, d = keys.shape
    assert qkv.stride(1) == 1 and qkv.shape[1] == (h + 2 * hkv) * d and hk == hkv
    assert keys.is_contiguous() and values.is_contiguous() and slots.is_contiguous()
    assert cos.is_contiguous() and sin.is_contiguous()
    _ok(_fn("rope_write", qkv.dtype)(qkv.data_ptr(), qkv.stride(0), cos.data_ptr(), sin.data_ptr(),
                                     t, h, hkv, d, keys.data_ptr(), values.data_ptr(), nblocks,
                                     bs, slots.data_ptr()), "rope + KV write")


def decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                     tables: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    """Attention of one query token per sequence over its paged context.

    q: [B, H, d] (heads and d contiguous); keys, values: [Hkv, num_blocks, bs, d]
    contiguous; tables: [B, nb] int64 block ids; lens: [B] int64 context lengths.
    -> [B, H, d]
    """
    b, h, d = q.shape
    hkv, nblocks, bs, _ = keys.shape
    assert q.stride(2) == 1 and q.stride(1) == d and keys.is_contiguous()
    assert values.is_contiguous() and tables.is_contiguous() and lens.is_contiguous()
    out = torch.empty(b, h, d, dtype=q.dtype)
    _ok(_fn("decode_attn", q.dtype)(
        q.data_ptr(), q.stride(0), keys.data_ptr(), values.data_ptr(), hkv, nblocks, bs, d,
        tables.data_ptr(), tables.shape[1], lens.data_ptr(), out.data_ptr(), h * d, b, h,
        d**-0.5), "decode attention")
    return out


def prefill_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                      table: torch.Tensor, num_past: int, kernel: str = "native") -> torch.Tensor:
    """Causal attention of one sequence's new tokens over its paged context (theirs
    included, already in the cache).

    q: [n, H, d] (heads and d contiguous); keys, values: [Hkv, num_blocks, bs, d]
    contiguous; table: [nb] int64 block ids covering num_past + n tokens; `kernel`:
    "native" (fp32 vector arithmetic, csrc/prefill_attn.c) or "amx" (bf16 tiles,
    csrc/prefill_amx.c; see `amx_ready`). -> [n, H, d]
    """
    n, h, d = q.shape
    hkv, nblocks, bs, _ = keys.shape
    assert q.stride(2) == 1 and q.stride(1) == d and keys.is_contiguous()
    assert values.is_contiguous() and table.is_contiguous() and table.numel() * bs >= num_past + n
    assert kernel == "native" or q.dtype == torch.bfloat16, "the AMX kernel is bf16 only"
    out = torch.empty(n, h, d, dtype=q.dtype)
    fn = _fn("prefill_attn" if kernel == "native" else "prefill_amx", q.dtype)
    _ok(fn(q.data_ptr(), q.stride(0), keys.data_ptr(), values.data_ptr(), hkv, nblocks, bs, d,
           table.data_ptr(), num_past, n, out.data_ptr(), h * d, h, d**-0.5),
        f"{kernel} prefill attention")
    return out


@functools.cache
def amx_ready() -> bool:
    """The AMX prefill kernel runs here: built for a CPU with AMX-BF16, and the OS granted
    this process the tile state."""
    lib = library()
    return lib is not None and lib.amx_ready() == 1


def prefill_supported(num_heads: int, num_kv_heads: int, head_dim: int) -> bool:
    """The native prefill kernel handles these head shapes (pure check)."""
    return head_dim % 16 == 0 and head_dim <= 256 and num_heads % num_kv_heads == 0


def decode_supported(num_heads: int, num_kv_heads: int, head_dim: int) -> bool:
    """The native decode kernel handles these head shapes (pure check)."""
    return head_dim % 16 == 0 and head_dim <= 256 and num_heads // num_kv_heads <= 16


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def decode_layer(x: torch.Tensor, weights: list[torch.Tensor | None], eps: float,
                 heads: tuple[int, int, int], cos: torch.Tensor, sin: torch.Tensor,
                 keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor,
                 tables: torch.Tensor, lens: torch.Tensor, prefetch: str = "l1") -> torch.Tensor:
    """A whole decoder layer for M decode rows (csrc/decode_layer.c). x: [M, D] -> [M, D].

    weights: input norm, post norm, qkv, qkv bias, o, o bias, gate, up, down, each
    plain and contiguous (biases may be None); heads: (H, Hkv, d); cos, sin:
    [M, 1, d]; keys, values: [Hkv, num_blocks, bs, d]; slots: [M]; tables:
    [M, nb]; lens: [M] (all int64, contiguous); `prefetch`: the GEMVs' (`linear`).
    """
    m, dim = x.shape
    h, hkv, d = heads
    in_norm, post_norm, qkv, qkv_b, o, o_b, gate, up, down = weights
    assert x.is_contiguous() and gate is not None and keys.is_contiguous()
    out = torch.empty_like(x)
    _ok(_fn("decode_layer", x.dtype)(
        x.data_ptr(), out.data_ptr(), m, dim, h, hkv, d, gate.shape[0], _ptr(in_norm),
        _ptr(post_norm), eps, _ptr(qkv), _ptr(qkv_b), _ptr(o), _ptr(o_b), _ptr(gate), _ptr(up),
        _ptr(down), cos.data_ptr(), sin.data_ptr(), keys.data_ptr(), values.data_ptr(),
        keys.shape[1], keys.shape[2], slots.data_ptr(), tables.data_ptr(), tables.shape[1],
        lens.data_ptr(), PREFETCH_LEVELS[prefetch]), "decode layer")
    return out
