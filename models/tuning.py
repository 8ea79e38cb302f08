"""Start-up measurement of the fastest kernels on this CPU, cached on disk.

What is fastest differs between CPUs (AMX, AVX512-BF16, AVX2 only) and dtypes:
on one CPU explicit-matmul attention beat the flash kernel for half-precision
prefills, on another it is 10x slower. So nothing is assumed: on first load
of a (CPU, torch, model shape, dtype, threads) this module times

- each GEMM backend (`models.linear`) over the model's own layer weights at
  1, 16, 128 and 512 rows, weights streamed from memory as in a real step
  (from 128 rows, compute-bound, over three layers' weights), then
  the native GEMV (`models.native`) prefetching into L1 against L2 at 1 and 2
  rows, then the faster of them against the chosen backend at 1, 2, 4 and 8 rows
  (where the GEMMs run on float32 copies, the GEMV reads the model-dtype copy:
  the rows it wins extend `half_rows`);
- SDPA against native flash kernels over the paged cache (fp32 vector arithmetic,
  and AMX tiles for bf16 where the CPU has them) for causal prefills of 16..512
  tokens (by total time), and explicit matmuls against the winner;
- the decode attention kernels at batch 1, 8 and 32 over mixed contexts in a
  paged cache (the gather included where a kernel needs one);
- aten against native RMSNorm + RoPE + KV write at 1..512 tokens;
- where the native GEMV takes decode steps on weights of the model's dtype: the
  layers op by op against one native call per layer, for decode steps of 1 and
  the most rows it takes;
- a layer's GEMMs at row counts new to the process, first run against later
  runs, and against the same rows padded to a multiple of 16: oneDNN builds a
  primitive per row count on first use, so where that costs more than the
  padding, layer groups pad their rows (a live stream meets new prompt
  lengths all the time);

then writes the choice, every timing and whether the native kernels were on
(how they were built, or why not) to `cache_root()/kernels/*.json`, which later
loads read back at once (about two seconds of measuring for the default model,
once per machine). Whether the native kernels could be built is part of the
key: a machine that gains a C compiler measures again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from models import native, probes
from models.choices import KernelChoice, LayerChoice
from models.config import ModelConfig
from models.cpu import cpu_caps, in_own_thread
from models.default_model import cache_root
from models.layers import LayerWeights
from models.linear import onednn_available
from models.steps import startup_step

logger = logging.getLogger(__name__)

TUNING_VERSION = 10  # NOTE: bump when candidates or the method change, so caches are remeasured


@dataclass(slots=True)
class Tuned:
    """A measured choice, what it was measured on, and the timings behind it (ms)."""

    choice: KernelChoice
    key: dict[str, Any]
    timings_ms: dict[str, Any]
    measured_s: float
    cpu: str  # the capability line
    native: str = ""  # the native kernels: how they were built, or why they are off
    from_cache: bool = False


def measure(layers: list[LayerWeights], cfg: ModelConfig, dtype: torch.dtype,
            threads: int = 1, repeats: int = 5) -> Tuned:
    """Time every candidate on this CPU (on a thread of its own, on `threads` threads)."""
    t0 = time.perf_counter()
    choice, timings = in_own_thread(threads, lambda: _measure(layers, cfg, dtype, repeats))
    return Tuned(choice, tuning_key(cfg, dtype, threads), timings, time.perf_counter() - t0,
                 cpu_caps().line(), native.note())


def _measure(layers: list[LayerWeights], cfg: ModelConfig, dtype: torch.dtype,
             repeats: int) -> tuple[KernelChoice, dict[str, Any]]:
    with torch.inference_mode():
        gemm, gemm_ms = probes.measure_gemm(layers, dtype, repeats)
        limit, prefill, prefill_ms = probes.measure_prefill(cfg, dtype, repeats)
        decode, decode_ms = probes.measure_decode(cfg, dtype, repeats)
        norm_rope, norm_ms = probes.measure_norm_rope(cfg, dtype, repeats)
        layer = LayerChoice(limit, decode, norm_rope, prefill=prefill)
        whole, whole_ms = probes.measure_decode_layer(layers, cfg, dtype, gemm, layer, repeats)
        pad, pad_ms = probes.measure_pad(layers, dtype, gemm, repeats)
    choice = KernelChoice(gemm, replace(layer, decode_layer=whole, pad_rows=pad))
    timings = {"gemm": gemm_ms, "prefill_attention": prefill_ms, "decode_attention": decode_ms,
               "norm_rope": norm_ms, "decode_layer": whole_ms, "pad_rows": pad_ms}
    return choice, timings


def tuning_key(cfg: ModelConfig, dtype: torch.dtype, threads: int) -> dict[str, Any]:
    """What a measured choice depends on."""
    shape = {k: getattr(cfg, k) for k in ("hidden_size", "intermediate_size", "num_layers",
                                          "num_heads", "num_kv_heads", "head_dim", "qkv_bias")}
    return {"cpu": asdict(cpu_caps()), "torch": torch.__version__, "dtype": str(dtype),
            "threads": threads, "shape": shape, "native": native.build_id(),
            "onednn": onednn_available(dtype),  # NOTE: $ONEDNN_MAX_CPU_ISA can take it away
            "version": TUNING_VERSION}


def cache_path(key: dict[str, Any], cache_dir: Path | None = None) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return (cache_dir or cache_root()) / "kernels" / f"{digest}.json"


def _read(path: Path, key: dict[str, Any]) -> Tuned | None:
    try:
        d = json.loads(path.read_text())
        if d["key"] != json.loads(json.dumps(key)):
            return None
        return Tuned(KernelChoice.from_dict(d["choice"]), d["key"], d["timings_ms"],
                     d["measured_s"], d["cpu"], d["native"], from_cache=True)
    except (OSError, ValueError, KeyError, TypeError) as e:
        logger.warning("ignoring kernel cache %s: %s", path, e)
        return None


def _write(path: Path, t: Tuned) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{time.monotonic_ns()}.tmp")
    tmp.write_text(json.dumps({"key": t.key, "choice": t.choice.to_dict(), "cpu": t.cpu,
                               "native": t.native, "measured_s": t.measured_s,
                               "timings_ms": t.timings_ms}, indent=1))
    tmp.replace(path)


def load_or_measure(layers: list[LayerWeights], cfg: ModelConfig, dtype: torch.dtype,
                    threads: int = 1, cache_dir: Path | None = None,
                    refresh: bool = False) -> Tuned:
    """The cached choice for this machine and model shape, else `measure` and cache it."""
    key = tuning_key(cfg, dtype, threads)
    path = cache_path(key, cache_dir)
    if path.is_file() and not refresh:
        cached = _read(path, key)
        if cached is not None:
            return cached
    with startup_step(logger, f"measuring the fastest CPU kernels on {threads} thread(s)",
                      f"once per machine and model shape; cached in {path}") as step:
        tuned = measure(layers, cfg, dtype, threads)
        step.result = f"on {tuned.cpu} (native kernels {tuned.native}): {tuned.choice.describe()}"
    try:
        _write(path, tuned)
    except OSError as e:  # NOTE: a read-only cache costs a measurement per load, not the load
        logger.warning("kernel choice not cached at %s: %s", path, e)
    return tuned
