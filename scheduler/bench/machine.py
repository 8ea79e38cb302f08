"""The machine line every scheduler bench prints beside its figures: the CPU's capability
line (`models.cpu`: which instruction sets its kernels could use) and the load average."""

from __future__ import annotations

import os

from models.cpu import cpu_caps


def capability_line() -> str:
    """e.g. `Intel(R) Xeon(R) Processor, 2 CPUs: AMX yes, AVX512-BF16 yes, AVX512 yes, AVX2
    yes; torch 2.13.0 dispatches AVX512`."""
    return cpu_caps().line()


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
