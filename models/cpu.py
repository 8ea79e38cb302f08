"""The CPU's capability line: which instruction sets the fast paths could use here.

Read from `/proc/cpuinfo` (Linux); elsewhere every flag reads False and only
the portable paths are candidates. The line is printed beside every speed
figure and is part of the key under which kernel choices are cached.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch

T = TypeVar("T")

_CPUINFO = Path("/proc/cpuinfo")


@dataclass(frozen=True, slots=True)
class CpuCaps:
    """Instruction sets of this CPU that matter to the GEMM and attention kernels."""

    model_name: str
    num_cpus: int
    amx: bool  # AMX tiles with bf16 (amx_tile + amx_bf16)
    avx512_bf16: bool
    avx512: bool  # avx512f
    avx2: bool
    torch_isa: str  # the ISA torch's own CPU kernels dispatch to

    def line(self) -> str:
        yes = {True: "yes", False: "no"}
        return (f"{self.model_name}, {self.num_cpus} CPUs: AMX {yes[self.amx]}, AVX512-BF16 "
                f"{yes[self.avx512_bf16]}, AVX512 {yes[self.avx512]}, AVX2 {yes[self.avx2]}; "
                f"torch {torch.__version__} dispatches {self.torch_isa}")


def parse_cpuinfo(text: str, num_cpus: int, torch_isa: str) -> CpuCaps:
    """Capabilities from the text of /proc/cpuinfo (its first processor block)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    flags = set(fields.get("flags", "").split())
    return CpuCaps(model_name=fields.get("model name", "unknown CPU"), num_cpus=num_cpus,
                   amx={"amx_tile", "amx_bf16"} <= flags, avx512_bf16="avx512_bf16" in flags,
                   avx512="avx512f" in flags, avx2="avx2" in flags, torch_isa=torch_isa)


@functools.cache
def cpu_caps() -> CpuCaps:
    """This machine's capabilities (read once per process)."""
    text = _CPUINFO.read_text() if _CPUINFO.is_file() else ""
    return parse_cpuinfo(text, os.cpu_count() or 1, torch.backends.cpu.get_cpu_capability())


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """torch's intra-op threads set to `n` inside the block, restored after."""
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def keep_threads(n: int) -> None:
    """Hold the calling thread to `n` intra-op threads from now on.

    NOTE: torch applies its thread count to a thread lazily, at that thread's first
    parallel call, from a process-wide value that any thread's `torch.set_num_threads`
    changes; asking for the count applies it at once, and later changes elsewhere leave
    this thread alone.
    """
    torch.set_num_threads(n)
    torch.get_num_threads()


def in_own_thread(threads: int, fn: Callable[[], T]) -> T:
    """`fn()` on a new thread with `threads` intra-op threads, which ends when it returns
    (what it raises is raised here).

    NOTE: an OpenMP team lives as long as the thread that started it, and once libgomp
    manages more threads than the machine has cores its workers sleep almost at once
    between parallel regions: a server's executor at 2 threads ran its ops 1.7x slower
    while a start-up measurement's team of 2 lived on in the main thread. Start-up and
    background measurements run here, and leave no team behind.
    """
    out: list[T] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            keep_threads(threads)
            out.append(fn())
        except BaseException as e:  # NOTE: re-raised in the calling thread
            failed.append(e)

    worker = threading.Thread(target=run, name=f"torch-{threads}-threads")
    worker.start()
    worker.join()
    if failed:
        raise failed[0]
    return out[0]
