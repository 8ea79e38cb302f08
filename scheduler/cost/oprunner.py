"""Timing primitives of profiling: run a model's operator chain for batches of given shapes,
time activation copies between devices, measure the host's copy bandwidth.

Every run is timed by a `Clock` (wall time by default, as the executors stamp ops).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from models.batch import Batch, BatchShape, SeqSpec, build_batch
from models.kv_cache import KVCache, blocks_for
from models.loader import Model
from models.ops import Op

Case = tuple[tuple[int, ...], tuple[int, ...]]  # (new tokens per seq, past tokens per seq)
# runs one timed op where it should run (a re-profile: on the device's executor thread)
OnDevice = Callable[[Callable[[], tuple[float, torch.Tensor]]], tuple[float, torch.Tensor]]


@dataclass(slots=True)
class OpSample:
    """One shape's timings: per template op, every run (seconds)."""

    shape: BatchShape
    runs: list[list[float]]  # [op][run]

    def median(self, op: int) -> float:
        return statistics.median(self.runs[op])

    def cov(self, op: int) -> float:
        """Coefficient of variation of one op's runs."""
        r = self.runs[op]
        return statistics.pstdev(r) / statistics.fmean(r) if len(r) > 1 else 0.0


def _sync(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


Clock = Callable[[], float]
# NOTE: executors stamp wall time, so estimators are fitted on it; `time.thread_time`
# (CPU time of this thread) is there to tell model error from preemption on a busy host.
CLOCKS: dict[str, Clock] = {"wall": time.perf_counter, "cpu": time.thread_time}


class ShapeRunner:
    """Runs the operator chain of `model` on one device for batches of given shapes."""

    def __init__(self, model: Model, device: torch.device, cases: Sequence[Case],
                 block_size: int = 16, clock: Clock = time.perf_counter,
                 variants: bool = False) -> None:
        self.model, self.device, self.block_size = model, device, block_size
        self.clock = clock
        # NOTE: with `variants`, the variant chains' ops too (models/variants.py), in template
        # index order: each layer group is fed what its first layer takes in the chain
        self.ops = model.all_ops_on(device) if variants else model.ops_on(device)
        need = max(sum(blocks_for(n + p, block_size) for n, p in zip(*c, strict=True))
                   for c in cases)
        self.kv: KVCache = model.new_kv_cache(need, block_size, device=device)
        for t in [*self.kv.keys.values(), *self.kv.values.values()]:
            t.fill_(0.01)  # NOTE: touch every page, or untouched zero pages make reads cheap
        self._sync = _sync(device)

    def batch(self, case: Case) -> Batch:
        """A batch of `case`'s shape. Its KV blocks go back to the pool at once: batches of
        different cases share blocks (only one runs at a time), sequences of one never do."""
        seqs = []
        vocab = self.model.config.vocab_size
        for i, (n, past) in enumerate(zip(*case, strict=True)):
            table = self.kv.allocator.allocate(blocks_for(n + past, self.block_size))
            ids = [(7 * i + 13 * j + 1) % vocab for j in range(n)]
            seqs.append(SeqSpec(f"p{i}", ids, past, table, sample=True))
        batch = build_batch(seqs, self.block_size, self.device)
        for s in seqs:
            self.kv.allocator.free(list(s.block_table))
        return batch

    def run_once(self, batch: Batch, pause: Callable[[], None] | None = None,
                 on_device: OnDevice | None = None) -> list[float]:
        """Seconds of each op, one chain run; `pause` runs before each op, off its clock;
        `on_device` runs each timed op (default: here)."""
        times: list[float] = []
        x: torch.Tensor | None = None
        clock = self.clock
        before: dict[int, torch.Tensor] = {}  # layer -> the input of that layer
        for op in self.ops:
            if pause is not None:
                pause()
            first = op.template.layers.start if op.template.layers else None
            if first in before:
                x = before[first]  # NOTE: a variant's op after the chain's: rewind
            elif first is not None and x is not None:
                before[first] = x

            def timed(op: Op = op, x: torch.Tensor | None = x) -> tuple[float, torch.Tensor]:
                t0 = clock()
                out = op.run(batch, x, self.kv)
                self._sync()
                return clock() - t0, out
            seconds, x = timed() if on_device is None else on_device(timed)
            times.append(seconds)
        return times

    def sample_all(self, cases: Sequence[Case], repeats: int,
                   pause: Callable[[], None] | None = None,
                   on_device: OnDevice | None = None) -> list[OpSample]:
        """Every case `repeats` times after a warm-up round, interleaved (each round runs
        every case once), so a change in background load hits all shapes alike. `pause`
        runs before each op (a re-profile waits there while the serving devices work, so
        that it overlaps them by one op at most, not by a whole chain).

        NOTE: each round runs the cases in another (seeded) order: a small op's time
        depends on what ran just before it (the embedding after a head is cache-cold),
        and a fixed order would make that a stable error of each case."""
        batches = [self.batch(c) for c in cases]
        runs: list[list[list[float]]] = [[] for _ in cases]
        order = list(range(len(batches)))
        rng = random.Random(0)
        for r in range(repeats + 1):
            for i in order:
                t = self.run_once(batches[i], pause, on_device)
                if r:
                    runs[i].append(t)
            rng.shuffle(order)
        return [OpSample(b.shape, [list(col) for col in zip(*rs, strict=True)])
                for b, rs in zip(batches, runs, strict=True)]


def time_copies(model: Model, src: torch.device, dst: torch.device,
                tokens: Sequence[int], repeats: int,
                clock: Clock = time.perf_counter) -> list[tuple[int, list[float]]]:
    """(bytes, seconds per run) of copying [n, hidden] activations src -> dst, for each n in
    `tokens`: a fresh destination buffer each run (the RECV, not timed), rounds interleaved."""
    xs = [torch.randn(n, model.config.hidden_size).to(device=src, dtype=model.dtype)
          for n in tokens]
    sync_src, sync_dst = _sync(src), _sync(dst)
    times: list[list[float]] = [[] for _ in xs]
    for r in range(repeats + 1):  # round 0 is a warm-up
        for x, ts in zip(xs, times, strict=True):
            buf = torch.empty(x.shape, dtype=x.dtype, device=dst)
            sync_dst()
            t0 = clock()
            buf.copy_(x, non_blocking=src.type == "cuda")
            sync_src()
            sync_dst()
            if r:
                ts.append(clock() - t0)
    return [(x.numel() * x.element_size(), ts) for x, ts in zip(xs, times, strict=True)]


def copy_bandwidth(num_bytes: int = 64 << 20, repeats: int = 5) -> float:
    """Host memory copy bandwidth in bytes/s (median of `repeats` copies of `num_bytes`)."""
    src = torch.ones(num_bytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return num_bytes / statistics.median(times[1:])
