"""Start-up profiling of interference: how much each op class slows down while another
device of its host runs ops of each class (pairwise, as OpScale's co-location model).

`measure` times a round of victim ops on one device with the other devices of its
host idle, then with them looping ops of one class, for each class in turn; each
round is repeated and the rounds are interleaved, so a change in background load
hits the idle and busy rounds alike. The slowdown of (victim class, background
class) is the median busy time over the median idle time. `TorchCoRun` runs the
model's operators on threads, as the CPU executors do; a `CoRun` on fake
executors (tests) recovers the slowdown it was given.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

import torch

from executors.interference import OP_CLASSES, op_class
from models.batch import Batch
from models.cpu import torch_threads
from models.loader import Model
from scheduler.cost.oprunner import Case, Clock, ShapeRunner

# (new tokens per seq, past tokens per seq): a prefill, a decode batch, a lone decode
COLOCATION_CASES: tuple[Case, ...] = (((128,), (0,)), ((1,) * 16, (256,) * 16),
                                      ((1,), (128,)))
COPY_TOKENS = (16, 256, 1024)  # activation rows of the copies timed as `send`
COPY_RUNS = 10  # copies of each size per round (each takes microseconds)


class CoRun(Protocol):
    """Victim ops on one device; the other devices of its host idle or busy."""

    def victims(self) -> dict[str, float]:
        """Seconds per op class of one round of victim ops (run now, in this thread)."""
        ...

    def background(self, cls: str) -> Any:
        """A context manager: inside it the other devices loop ops of class `cls`."""
        ...


def measure(corun: CoRun, classes: Sequence[str] = OP_CLASSES, repeats: int = 3
            ) -> dict[tuple[str, str], float]:
    """Slowdown per (victim class, background class): median busy / median idle seconds
    of `repeats` interleaved rounds, after one warm-up round of each."""
    idle: dict[str, list[float]] = {}
    busy: dict[tuple[str, str], list[float]] = {}
    for r in range(repeats + 1):
        alone = corun.victims()
        if r:
            for a, s in alone.items():
                idle.setdefault(a, []).append(s)
        for b in classes:
            with corun.background(b):
                times = corun.victims()
            if r:
                for a, s in times.items():
                    busy.setdefault((a, b), []).append(s)
    out = {}
    for (a, b), runs in busy.items():
        base = statistics.median(idle[a])
        if base > 0:
            out[(a, b)] = statistics.median(runs) / base
    return out


class TorchCoRun:
    """Victims: the chain over `cases` on one thread (plus activation copies as `send`);
    background: another thread looping one class's ops over the same cases, with its own
    KV cache, as a second CPU executor would."""

    def __init__(self, model: Model, device: torch.device, cases: Sequence[Case] = COLOCATION_CASES,
                 threads: int = 1, block_size: int = 16, clock: Clock = time.perf_counter) -> None:
        self.model, self.threads, self.clock = model, threads, clock
        self.victim = ShapeRunner(model, device, cases, block_size, clock)
        self.other = ShapeRunner(model, device, cases, block_size, clock)
        self.batches = [self.victim.batch(c) for c in cases]
        self.other_batches = [self.other.batch(c) for c in cases]
        self.classes = [op_class(t.name) for t in model.template.ops]
        hidden = model.config.hidden_size
        self.copies = [torch.randn(n, hidden).to(device=device, dtype=model.dtype)
                       for n in COPY_TOKENS]
        self._inputs = [self._chain_inputs(b) for b in self.other_batches]

    def _chain_inputs(self, batch: Batch) -> list[Any]:
        """The input of each op of the chain on `batch` (the other runner's)."""
        xs: list[Any] = []
        x = None
        for op in self.other.ops:
            xs.append(x)
            x = op.run(batch, x, self.other.kv)
        return xs

    def victims(self) -> dict[str, float]:
        out = dict.fromkeys(OP_CLASSES, 0.0)
        for b in self.batches:
            for cls, s in zip(self.classes, self.victim.run_once(b), strict=True):
                if cls is not None:
                    out[cls] += s
        out["send"] = self._copy_seconds(COPY_RUNS)
        return out

    def _copy_seconds(self, runs: int) -> float:
        total = 0.0
        for x in self.copies:
            times = []
            for _ in range(runs):
                buf = torch.empty_like(x)
                t0 = self.clock()
                buf.copy_(x)
                times.append(self.clock() - t0)
            total += statistics.median(times)
        return total

    @contextmanager
    def background(self, cls: str) -> Iterator[None]:
        stop, started = threading.Event(), threading.Event()
        failed: list[BaseException] = []

        def loop() -> None:
            try:
                with torch_threads(self.threads):
                    started.set()
                    while not stop.is_set():
                        self._background_round(cls, stop)
            except BaseException as e:  # NOTE: re-raised in the measuring thread
                failed.append(e)
                started.set()

        worker = threading.Thread(target=loop, name=f"colocation-{cls}", daemon=True)
        worker.start()
        started.wait()
        try:
            yield
        finally:
            stop.set()
            worker.join()
        if failed:
            raise RuntimeError(f"co-location background ({cls}) failed") from failed[0]

    def _background_round(self, cls: str, stop: threading.Event) -> None:
        if cls == "send":
            for x in self.copies:
                torch.empty_like(x).copy_(x)
            return
        for batch, xs in zip(self.other_batches, self._inputs, strict=True):
            for op, c, x in zip(self.other.ops, self.classes, xs, strict=True):
                if c == cls and not stop.is_set():
                    op.run(batch, x, self.other.kv)


def profile_colocation(model: Model, device: torch.device, threads: int = 1,
                       repeats: int = 3, clock: Clock = time.perf_counter
                       ) -> dict[tuple[str, str], float]:
    """Pairwise slowdowns of the model's op classes on the host of `device`."""
    with torch_threads(threads):
        return measure(TorchCoRun(model, device, threads=threads, clock=clock),
                       repeats=repeats)
