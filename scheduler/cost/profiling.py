"""Start-up profiling: time the real operators over a sweep of shapes and fit the estimators.

For each device kind the sweep runs the model's operator chain (through
`models` directly, in the calling thread, on `threads` torch threads) for
prefills, prefill chunks on top of KV, and decode batches × context lengths;
each op's time is the median of `repeats` runs after a warm-up, and each op's
sample CoV (run-to-run noise, the floor of any prediction's error) is kept
beside its fit. Transfers are timed as the copy of an activation tensor into a
freshly allocated buffer (what a SEND does after its RECV). Where two or more
`cpu:N` devices share this host, the co-location sweep (scheduler/cost/colocation.py)
measures how much each op class slows down while another device runs each
class. The fit is cached as JSON under `cache_root()/estimators`, keyed by
model folder, dtype, layers per group, device kinds, torch version and the
sweep, so a restart reads it back at once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from executors.interference import Interference
from executors.types import Device
from models import native
from models.batch import BatchShape
from models.cpu import in_own_thread
from models.default_model import cache_root
from models.loader import Model
from models.steps import startup_step
from models.template import GraphTemplate, OpKind
from scheduler.cost.colocation import profile_colocation
from scheduler.cost.estimators import Estimators
from scheduler.cost.features import device_kind
from scheduler.cost.linear import LinearEstimator
from scheduler.cost.oprunner import (
    Case,
    Clock,
    OnDevice,
    ShapeRunner,
    copy_bandwidth,
    time_copies,
)
from scheduler.cost.wide import measure_wide

logger = logging.getLogger(__name__)

# NOTE: bump when the measuring method changes, so caches are refitted (2: co-location
# slowdowns and each op's sample CoV are measured too; 3: each round runs the cases in a
# shuffled order; 4: decode batches of 2, for the rows within the native GEMV; 5: the wide
# factor of scheduler/cost/wide.py)
SWEEP_VERSION = 5
FALLBACK_FLOPS_S = 20e9  # compute rate assumed for a device kind never profiled
HOST = "local"  # the host of every cpu:N device (they share this machine's cores)

@dataclass(frozen=True, slots=True)
class Sweep:
    """The shapes profiled. Counts are tokens; a decode batch has one new token per seq."""

    prefill_tokens: tuple[int, ...] = (8, 32, 64, 128, 256, 512)
    chunks: tuple[tuple[int, int], ...] = ((32, 128), (128, 256))  # (new, past)
    decode_batches: tuple[int, ...] = (1, 2, 4, 16, 32)  # 1, 2: the native GEMV's rows
    decode_contexts: tuple[int, ...] = (32, 256, 512)
    transfer_tokens: tuple[int, ...] = (1, 16, 64, 256, 1024, 2048)
    repeats: int = 3
    transfer_repeats: int = 21  # copies take microseconds and jitter: many runs are cheap
    block_size: int = 16
    colocation_repeats: int = 3  # rounds of the co-location sweep (0: do not measure)
    wide_tokens: int = 384  # the prefill the wide factor is timed at (scheduler/cost/wide.py)
    wide_repeats: int = 3  # its runs on one device's threads and on two (0: do not measure)

    def cases(self) -> list[Case]:
        out: list[Case] = [((n,), (0,)) for n in self.prefill_tokens]
        out += [((n,), (p,)) for n, p in self.chunks]
        out += [((1,) * b, (c,) * b) for b in self.decode_batches for c in self.decode_contexts]
        return out


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


def fallback_coefficients(template: GraphTemplate, bandwidth_bytes_s: float,
                          flops_per_s: float = FALLBACK_FLOPS_S) -> Callable[[str], tuple]:
    """op name -> coefficients over `OP_FEATURES` for a device kind never profiled: its FLOPs
    at `flops_per_s` plus its weight and KV bytes read at `bandwidth_bytes_s` (conservative
    rates; the fit replaces them once the kind is profiled)."""
    ops = {t.name: t for t in template.all_ops}

    def coef(name: str) -> tuple[float, ...]:
        t = ops[name]
        per_token = t.flops(BatchShape(1, 0, 0, 0, 0)) / flops_per_s
        per_attn = (t.flops(BatchShape(0, 0, 0, 1, 0)) / flops_per_s)
        per_sampled = t.flops(BatchShape(0, 0, 1, 0, 0)) / flops_per_s
        per_context = t.kv_bytes_per_token / bandwidth_bytes_s
        if t.kind is OpKind.EMBED:
            per_token = t.output_bytes(BatchShape(1, 1, 0, 0, 0)) / bandwidth_bytes_s
        fixed = t.weight_bytes / bandwidth_bytes_s
        return (per_token, per_attn, 0.0, per_sampled, per_context, 0.0, 0.0, fixed)
    return coef


def profile(model: Model, devices: Sequence[Device | str], sweep: Sweep | None = None,
            threads: int = 1, kinds: dict[str, str] | None = None,
            clock: Clock = time.perf_counter) -> Estimators:
    """Time the sweep on one device of each kind (and each kind pair), fit estimators, and
    measure the co-location slowdowns of the CPU devices."""
    sweep = sweep or Sweep()
    names = [d if isinstance(d, str) else d.name for d in devices]
    kinds = {d: (kinds or {}).get(d) or device_kind(d) for d in names}
    est = Estimators(kinds)

    def run() -> None:
        for kind, dev in _representatives(names, kinds).items():
            fit_kind(est, model, kind, dev, sweep, clock)
        for (ks, kd), (s, d) in _pairs(names, kinds).items():
            est.fit_transfer(ks, kd, *profile_pair(model, s, d, sweep, clock))
        est.copy_bandwidth_bytes_s = copy_bandwidth()
        est.set_interference(colocation(model, names, sweep, threads, clock))
        est.wide_factor = wide_factor(model, names, sweep, threads, clock)
    with startup_step(logger, f"profiling the operators of {model.name} on {', '.join(names)}",
                      "once per model and devices; the fit is cached") as step:
        in_own_thread(threads, run)
        step.result = "sample CoV per op: {}; co-location: {}; wide factor: {}".format(
            ", ".join(f"{e.name} {e.sample_cov:.1%}" for e in est.ops.values()
                      if e.sample_cov is not None), est.interference,
            "-" if est.wide_factor is None else f"{est.wide_factor:.2f}")
    return est


def fit_kind(est: Estimators, model: Model, kind: str, device: str, sweep: Sweep,
             clock: Clock = time.perf_counter, pause: Callable[[], None] | None = None,
             on_device: OnDevice | None = None) -> None:
    """Time the sweep's cases on `device` and (re)fit every op of `kind` from them.
    `pause` runs before each op (a re-profile waits there for the host to go idle), and
    `on_device` runs each timed op (a re-profile's: on the device's executor thread)."""
    est.native_rows = native_rows(model)
    runner = ShapeRunner(model, Device(device, 1).torch_device, sweep.cases(),
                         sweep.block_size, clock, variants=True)
    samples = runner.sample_all(sweep.cases(), sweep.repeats, pause, on_device)
    for i, t in enumerate(model.template.all_ops):
        fitted = est.fit_op(kind, t.name, [s.shape for s in samples],
                            [s.median(i) for s in samples])
        fitted.sample_cov = statistics.fmean(s.cov(i) for s in samples)


def native_rows(model: Model) -> int:
    """Rows up to which the model's CPU kernels run their few-row path (the native GEMV, or
    half-precision weights beside float32 ones) (at least 1)."""
    return max(1, model.kernels.gemm.few_rows)


def cpu_hosts(names: Sequence[str]) -> dict[str, str]:
    """device -> host for the CPU devices among `names` (all on this machine's cores)."""
    return {n: HOST for n in names if n.startswith("cpu")}


def colocation(model: Model, names: Sequence[str], sweep: Sweep, threads: int = 1,
               clock: Clock = time.perf_counter) -> Interference | None:
    """The slowdowns of op classes overlapping on the CPU devices (None with fewer than two)."""
    hosts = cpu_hosts(names)
    if len(hosts) < 2 or sweep.colocation_repeats < 1:
        return None
    factors = profile_colocation(model, Device(next(iter(hosts)), 1).torch_device, threads,
                                 sweep.colocation_repeats, clock)
    return Interference(hosts, factors)


def wide_factor(model: Model, names: Sequence[str], sweep: Sweep, threads: int = 1,
                clock: Clock = time.perf_counter) -> float | None:
    """A wide op's time over its time on one device (None with fewer than two CPU devices
    on this host, or where the sweep does not measure it)."""
    if len(cpu_hosts(names)) < 2 or sweep.wide_repeats < 1:
        return None
    return measure_wide(model, sweep.wide_tokens, threads, sweep.wide_repeats, clock,
                        sweep.block_size)


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
    the kernels the CPU operators run (`models.tuning`) and the build of the native ones,
    torch, the threads and the sweep."""
    pairs = sorted(list(p) for p in _pairs(names, kinds))
    key: dict[str, object] = {
        "model": str(Path(model.path).resolve()), "dtype": str(model.dtype),
        "layers_per_group": model.template.layers_per_group,
        "kernels": model.kernels.to_dict(), "native": native.build_id(),
        "kinds": sorted(set(kinds[n] for n in names)), "pairs": pairs,
        "num_devices": len(names), "torch": torch.__version__, "threads": threads,
        "sweep": asdict(sweep), "version": SWEEP_VERSION}
    if model.template.variants:  # NOTE: only then, so that other keys stay as they were
        key["layer_groups"] = list(model.template.group_sizes)
    return key


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
    est = None if refresh else _read_cache(path, key, kinds)
    if est is None:
        est = profile(model, names, sweep, threads, kinds)
        est.meta = json.loads(json.dumps(key))  # JSON-normalised, as it reads back
        _write_atomically(path, est.to_json())
    est.cache_file = path
    return est


def _read_cache(path: Path, key: dict[str, object], kinds: dict[str, str]) -> Estimators | None:
    if not path.is_file():
        return None
    try:
        est = Estimators.from_json(path.read_text(), kinds)
    except (ValueError, KeyError) as e:
        logger.warning("ignoring estimator cache %s: %s", path, e)
        return None
    return est if est.meta == json.loads(json.dumps(key)) else None


def remember(path: Path, update: Callable[[Estimators], object]) -> None:
    """Apply `update` (a background re-profile's result) to the fit cached at `path`, so that
    the next start begins from what the machine measures now, not from the first profile.
    The cached fit holds profiles only: the live refit's observations are not written."""
    cached = Estimators.from_json(path.read_text())
    update(cached)
    _write_atomically(path, cached.to_json())


def take_kind(kind: str, fresh: Estimators) -> Callable[[Estimators], None]:
    """An update for `remember`: `kind`'s ops as a re-profile (`fresh`) fitted them, copied
    now (an op new to the kind is the live fit's own estimator from here on)."""
    fits = {k: e.to_dict() for k, e in fresh.ops.items() if k[0] == kind}

    def update(cached: Estimators) -> None:
        cached.ops.update({k: LinearEstimator.from_dict(d) for k, d in fits.items()})
    return update


def take_pair(src: str, dst: str, num_bytes: Sequence[int], seconds: Sequence[float]
              ) -> Callable[[Estimators], None]:
    """An update for `remember`: the pair's transfers refitted, where the cached fit has the
    pair (a pair it lacks belongs to another set of devices: a fit is keyed by them)."""
    def update(cached: Estimators) -> None:
        if (src, dst) in cached.transfers:
            cached.fit_transfer(src, dst, num_bytes, seconds)
    return update


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
