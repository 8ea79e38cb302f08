"""Start-up profiling: time the real operators over a sweep of shapes and fit the estimators.

For each device kind the sweep runs the model's operator chain (through
`models` directly, in the calling thread, on `threads` torch threads) for
prefills, prefill chunks on top of KV, and decode batches × context lengths;
each op's time is the median of `repeats` runs after a warm-up. Transfers are
timed as the copy of an activation tensor into a freshly allocated buffer (what
a SEND does after its RECV). The fit is cached as JSON under
`cache_root()/estimators`, keyed by model folder, dtype, layers per group,
device kinds, torch version and the sweep, so a restart reads it back at once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from executors.types import Device
from models.batch import Batch, BatchShape, SeqSpec, build_batch
from models.default_model import cache_root
from models.kv_cache import KVCache, blocks_for
from models.loader import Model
from models.template import GraphTemplate, OpKind
from scheduler.estimators import Estimators, device_kind

logger = logging.getLogger(__name__)

SWEEP_VERSION = 1  # NOTE: bump when the measuring method changes, so caches are refitted
FALLBACK_FLOPS_S = 20e9  # compute rate assumed for a device kind never profiled

Case = tuple[tuple[int, ...], tuple[int, ...]]  # (new tokens per seq, past tokens per seq)


@dataclass(frozen=True, slots=True)
class Sweep:
    """The shapes profiled. Counts are tokens; a decode batch has one new token per seq."""

    prefill_tokens: tuple[int, ...] = (8, 32, 64, 128, 256, 512)
    chunks: tuple[tuple[int, int], ...] = ((32, 128), (128, 256))  # (new, past)
    decode_batches: tuple[int, ...] = (1, 4, 16, 32)
    decode_contexts: tuple[int, ...] = (32, 256, 512)
    transfer_tokens: tuple[int, ...] = (1, 16, 64, 256, 1024, 2048)
    repeats: int = 3
    transfer_repeats: int = 21  # copies take microseconds and jitter: many runs are cheap
    block_size: int = 16

    def cases(self) -> list[Case]:
        out: list[Case] = [((n,), (0,)) for n in self.prefill_tokens]
        out += [((n,), (p,)) for n, p in self.chunks]
        out += [((1,) * b, (c,) * b) for b in self.decode_batches for c in self.decode_contexts]
        return out


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
                 block_size: int = 16, clock: Clock = time.perf_counter) -> None:
        self.model, self.device, self.block_size = model, device, block_size
        self.clock = clock
        self.ops = model.ops_on(device)
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

    def run_once(self, batch: Batch) -> list[float]:
        """Seconds of each op, one chain run."""
        times, x = [], None
        clock = self.clock
        for op in self.ops:
            t0 = clock()
            x = op.run(batch, x, self.kv)
            self._sync()
            times.append(clock() - t0)
        return times

    def sample_all(self, cases: Sequence[Case], repeats: int) -> list[OpSample]:
        """Every case `repeats` times after a warm-up round, interleaved (each round runs
        every case once), so a change in background load hits all shapes alike."""
        batches = [self.batch(c) for c in cases]
        runs: list[list[list[float]]] = [[] for _ in cases]
        for r in range(repeats + 1):
            for i, b in enumerate(batches):
                t = self.run_once(b)
                if r:
                    runs[i].append(t)
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


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def _representatives(devices: Sequence[str], kinds: dict[str, str]) -> dict[str, str]:
    """First device of each kind."""
    out: dict[str, str] = {}
    for d in devices:
        out.setdefault(kinds[d], d)
    return out


def _pairs(devices: Sequence[str], kinds: dict[str, str]) -> dict[tuple[str, str], tuple[str, str]]:
    """First (src, dst) device pair of each (kind, kind) pair."""
    out: dict[tuple[str, str], tuple[str, str]] = {}
    for s in devices:
        for d in devices:
            if s != d:
                out.setdefault((kinds[s], kinds[d]), (s, d))
    return out


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


def fallback_coefficients(template: GraphTemplate, bandwidth_bytes_s: float,
                          flops_per_s: float = FALLBACK_FLOPS_S) -> Callable[[str], tuple]:
    """op name -> coefficients over `OP_FEATURES` for a device kind never profiled: its FLOPs
    at `flops_per_s` plus its weight and KV bytes read at `bandwidth_bytes_s` (conservative
    rates; the fit replaces them once the kind is profiled)."""
    ops = {t.name: t for t in template.ops}

    def coef(name: str) -> tuple[float, ...]:
        t = ops[name]
        per_token = t.flops(BatchShape(1, 0, 0, 0, 0)) / flops_per_s
        per_attn = (t.flops(BatchShape(0, 0, 0, 1, 0)) / flops_per_s)
        per_sampled = t.flops(BatchShape(0, 0, 1, 0, 0)) / flops_per_s
        per_context = t.kv_bytes_per_token / bandwidth_bytes_s
        if t.kind is OpKind.EMBED:
            per_token = t.output_bytes(BatchShape(1, 1, 0, 0, 0)) / bandwidth_bytes_s
        fixed = t.weight_bytes / bandwidth_bytes_s
        return (per_token, per_attn, 0.0, per_sampled, per_context, fixed)
    return coef


def profile(model: Model, devices: Sequence[Device | str], sweep: Sweep | None = None,
            threads: int = 1, kinds: dict[str, str] | None = None,
            clock: Clock = time.perf_counter) -> Estimators:
    """Time the sweep on one device of each kind (and each kind pair) and fit estimators."""
    sweep = sweep or Sweep()
    names = [d if isinstance(d, str) else d.name for d in devices]
    kinds = {d: (kinds or {}).get(d) or device_kind(d) for d in names}
    est = Estimators(kinds)
    t0 = time.perf_counter()
    with torch_threads(threads):
        for kind, dev in _representatives(names, kinds).items():
            runner = ShapeRunner(model, Device(dev, 1).torch_device, sweep.cases(),
                                 sweep.block_size, clock)
            samples = runner.sample_all(sweep.cases(), sweep.repeats)
            for i, t in enumerate(model.template.ops):
                est.fit_op(kind, t.name, [s.shape for s in samples],
                           [s.median(i) for s in samples])
        for (ks, kd), (s, d) in _pairs(names, kinds).items():
            est.fit_transfer(ks, kd, *profile_pair(model, s, d, sweep, clock))
        est.copy_bandwidth_bytes_s = copy_bandwidth()
    logger.info("profiled %s on %s in %.1f s", model.name, ", ".join(names),
                time.perf_counter() - t0)
    return est


def profile_pair(model: Model, src: str, dst: str, sweep: Sweep | None = None,
                 clock: Clock = time.perf_counter) -> tuple[list[int], list[float]]:
    """Time copies src -> dst over the sweep's sizes: (bytes, median seconds) per size."""
    sweep = sweep or Sweep()
    meas = time_copies(model, Device(src, 1).torch_device, Device(dst, 1).torch_device,
                       sweep.transfer_tokens, sweep.transfer_repeats, clock)
    return [b for b, _ in meas], [statistics.median(ts) for _, ts in meas]


def cache_key(model: Model, names: Sequence[str], kinds: dict[str, str], sweep: Sweep,
              threads: int) -> dict[str, object]:
    """What a cached fit depends on: the model, the device kinds, every (kind, kind) pair
    profiled and the device count (a one-device fit is never read back for two devices),
    the kernels the CPU operators run (`models.tuning`), torch, the threads and the sweep."""
    pairs = sorted(list(p) for p in _pairs(names, kinds))
    return {"model": str(Path(model.path).resolve()), "dtype": str(model.dtype),
            "layers_per_group": model.template.layers_per_group,
            "kernels": model.kernels.to_dict(),
            "kinds": sorted(set(kinds[n] for n in names)), "pairs": pairs,
            "num_devices": len(names), "torch": torch.__version__, "threads": threads,
            "sweep": asdict(sweep), "version": SWEEP_VERSION}


def cache_path(key: dict[str, object], cache_dir: Path | None = None) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    name = Path(str(key["model"])).name
    return (cache_dir or cache_root()) / "estimators" / f"{name}-{digest}.json"


def load_or_profile(model: Model, devices: Sequence[Device | str], cache_dir: Path | None = None,
                    sweep: Sweep | None = None, threads: int = 1, refresh: bool = False,
                    kinds: dict[str, str] | None = None) -> Estimators:
    """The cached fit for this model and these device kinds, else `profile` and cache it."""
    sweep = sweep or Sweep()
    names = [d if isinstance(d, str) else d.name for d in devices]
    kinds = {d: (kinds or {}).get(d) or device_kind(d) for d in names}
    key = cache_key(model, names, kinds, sweep, threads)
    path = cache_path(key, cache_dir)
    if path.is_file() and not refresh:
        try:
            est = Estimators.from_json(path.read_text(), kinds)
            if est.meta == json.loads(json.dumps(key)):
                return est
        except (ValueError, KeyError) as e:
            logger.warning("ignoring estimator cache %s: %s", path, e)
    est = profile(model, names, sweep, threads, kinds)
    est.meta = json.loads(json.dumps(key))  # JSON-normalised, as it reads back
    _write_atomically(path, est.to_json())
    return est


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
