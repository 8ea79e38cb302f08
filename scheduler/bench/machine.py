"""The machine line every scheduler bench prints beside its figures: the CPU's capability
line (which instruction sets its kernels could use) and the load average."""

from __future__ import annotations

import os
from pathlib import Path

import torch

_CPUINFO = Path("/proc/cpuinfo")


def capability_line() -> str:
    """e.g. `Intel(R) Xeon(R) Processor, 2 CPUs: AMX yes, AVX512-BF16 yes, AVX512 yes, AVX2
    yes; torch 2.13.0 dispatches AVX512` (from /proc/cpuinfo; flags read no elsewhere)."""
    fields: dict[str, str] = {}
    text = _CPUINFO.read_text() if _CPUINFO.is_file() else ""
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    flags = set(fields.get("flags", "").split())
    yes = {True: "yes", False: "no"}
    return (f"{fields.get('model name', 'unknown CPU')}, {os.cpu_count() or 1} CPUs: "
            f"AMX {yes[{'amx_tile', 'amx_bf16'} <= flags]}, "
            f"AVX512-BF16 {yes['avx512_bf16' in flags]}, AVX512 {yes['avx512f' in flags]}, "
            f"AVX2 {yes['avx2' in flags]}; torch {torch.__version__} dispatches "
            f"{torch.backends.cpu.get_cpu_capability()}")


def load_average() -> tuple[float, float, float] | None:
    try:
        return os.getloadavg()
    except OSError:
        return None


def machine_line() -> str:
    """The capability line and the 1/5/15-minute load average, for a bench's header."""
    load = load_average()
    avg = "n/a" if load is None else " / ".join(f"{x:.2f}" for x in load)
    return f"machine: {capability_line()}; load average {avg}"
