"""Build a ready-to-start Scheduler from a model and a device list (gateway, benches)."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path

import torch

from executors.interference import Interference
from executors.types import Device, Priority
from models.loader import Model
from models.modelset import ModelSet, first_model
from scheduler.config import SchedulerConfig
from scheduler.core.components import model_devices
from scheduler.core.execution import ExecutorFactory, cpu_threads, default_factory
from scheduler.core.faults import faulty
from scheduler.cost import firstrows
from scheduler.cost.deferral import ServingLoad
from scheduler.cost.estimators import FALLBACK_BANDWIDTH_BYTES_S, FALLBACK_MARGIN, Estimators
from scheduler.cost.profiling import cpu_hosts, fallback_coefficients, load_or_profile
from scheduler.cost.reprofile import Chain, PairProfiler
from scheduler.memory.pools import check_weights
from scheduler.scheduler import Scheduler
from scheduler.sim import native as simloop

__all__ = ["build_scheduler", "cpu_threads", "local_executors", "parse_devices"]
logger = logging.getLogger(__name__)
_DEVICE = re.compile(r"^([^/\s]+/)?(cuda|cpu):\d+$")
RAY_ALL = "ray:all"  # every device of a Ray cluster (executors/ray_cluster.py)


def default_devices() -> list[str]:
    """Every GPU, or two virtual CPU devices without one."""
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return [f"cuda:{i}" for i in range(n)] if n else ["cpu:0", "cpu:1"]


def device_names(spec: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """`cpu:0,cpu:1` (or a list) -> validated device names; None = `default_devices()`.
    On a Ray cluster: `NODE/cpu:0,NODE/cuda:1` or `ray:all`."""
    if spec is None:
        spec = default_devices()
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    names = [str(n).strip() for n in items if str(n).strip()]
    if not names:
        raise ValueError("give at least one device (cuda:N or cpu:N)")
    if names == [RAY_ALL]:
        return names
    for name in names:
        if not _DEVICE.match(name):
            raise ValueError(f"{name!r} is not cuda:N or cpu:N (on a Ray cluster: "
                             f"NODE/cuda:N, NODE/cpu:N or {RAY_ALL})")
    if len(set(names)) != len(names):
        raise ValueError(f"a device is listed twice: {','.join(names)}")
    return names


def parse_devices(spec: str | list[str] | None, memory_gib: float) -> list[Device]:
    """Validated device names (see `device_names`) with one memory budget per device."""
    return [Device(n, int(memory_gib * 2**30)) for n in device_names(spec)]


def profiled_as(devices: list[Device]) -> list[Device]:
    """The devices to profile here: the local ones, and for remote CPU devices as many local
    stand-ins (`cpu:N`, the same kind: the fit is refined online from the actors' timings).

    NOTE: a remote GPU is priced by the fallback until its own timings refit it."""
    local = [d for d in devices if d.node is None]
    taken = {d.name for d in local}
    spare = (f"cpu:{i}" for i in range(len(devices) + len(taken)) if f"cpu:{i}" not in taken)
    return local + [Device(next(spare), d.memory_bytes) for d in devices
                    if d.node is not None and d.kind == "cpu"]


def build_scheduler(model: Model, devices: list[Device], cfg: SchedulerConfig,
                    estimators: Estimators | None = None,
                    executor_factory: ExecutorFactory | None = None,
                    threads: int = 1) -> Scheduler:
    """Profile (or load cached) estimators on `threads` intra-op threads (the CPU executors'),
    then make the scheduler; refits stay online."""
    check_weights(model, devices)
    model_devices(model, [d.name for d in devices], cfg)  # NOTE: its errors before profiling
    est, chains = (estimators, set_chains(model, {})) if estimators else \
        profiled(model, profiled_as(devices), threads)
    simloop.library()  # NOTE: the simulator's C loop built now (~0.4 s on a fresh cache),
    # not in the first round that simulates
    bandwidth = est.copy_bandwidth_bytes_s or FALLBACK_BANDWIDTH_BYTES_S
    est.fallback_op = fallback_coefficients(model.template, bandwidth / FALLBACK_MARGIN)
    sched = Scheduler(model, devices, cfg.policy, est.op_time, est.transfer_time, cfg,
                      executor_factory=executor_factory, estimator=est)
    if est.interference is not None:  # the profiled slowdowns, for these devices
        est.set_interference(est.interference.with_hosts(cpu_hosts([d.name for d in devices])))
    gmg = sched.gmg
    gmg.interference = est.interference  # the simulator slows ops overlapping on a host

    def learnt(inter: Interference) -> None:
        gmg.interference = inter

    est.on_interference = learnt
    local = [d.name for d in devices if d.node is None]
    # NOTE: a re-profile of a set times each member's chain and refits its ops under its
    # names in the set; transfers are timed with the first model's
    sched.profiler = PairProfiler(first_model(model), est, devices=local,
                                  idle=lambda: not gmg.scheduled, threads=threads,
                                  on_device=sched.exec.on_device,
                                  load=lambda: interactive_load(sched), chains=chains)
    est.on_drift = sched.profiler.request_kind if cfg.reprofile else None
    if cfg.wide_prefill and est.wide_factor is not None:
        sched.builder.wide_factor = est.wide_factor
        sched.builder.partners = wide_partners(devices)
    return sched


def wide_partners(devices: list[Device]) -> dict[str, tuple[str, ...]]:
    """device -> the devices that may lend it their cores for a wide plan: the other CPU
    devices of this host (`executors.wide`)."""
    cpus = [d.name for d in devices if d.node is None and d.kind == "cpu"]
    if len(cpus) < 2:
        return {}
    return {d: tuple(p for p in cpus if p != d) for d in cpus}


def profiled(model: Model, devices: list[Device], threads: int
             ) -> tuple[Estimators, list[Chain]]:
    """The estimators of `model` (cached or profiled now); of a model set, every member's
    under its op names in the set, and its chains for a re-profile (`set_chains`). NOTE: the
    set's estimators object is its first member's, so transfers and interference are
    profiled once."""
    if not isinstance(model, ModelSet):
        return load_or_profile(model, devices, threads=threads), []
    parts = [(m.name, load_or_profile(m.model, devices, threads=threads)) for m in model.members]
    caches = {name: e.cache_file for name, e in parts}
    est = parts[0][1]
    est.take_models(parts)
    return est, set_chains(model, caches)


def set_chains(model: Model, caches: Mapping[str, Path | None]) -> list[Chain]:
    """A set's members as a kind's re-profile times them, each written back into its own
    start-up fit's cache (`caches`, by member; absent: not written); [] for one model."""
    if not isinstance(model, ModelSet):
        return []
    return [Chain(m.model, f"{m.name}/", caches.get(m.name), m.devices) for m in model.members]


def interactive_load(sched: Scheduler) -> ServingLoad:
    """The high-class requests `sched` has queued and admitted (what defers a re-profile)."""
    high = [s for s in sched.states.values() if s.priority is Priority.HIGH]
    queued = sum(s.status.is_queued for s in high)
    return ServingLoad(queued, sum(s.status.holds_kv for s in high))


def local_executors(threads: int, fault_rate: float = 0.0,
                    first_rows: list[int] | None = None) -> ExecutorFactory:
    """The factory of this host's executors, each on `threads` intra-op threads; with
    `fault_rate` > 0 that share of their operators fails (`--fault-rate`, for testing).
    `first_rows`: the batch rows a warm-up already ran (their first-run charge is paid)."""
    if first_rows is not None:
        firstrows.PROCESS.ran(first_rows)
    factory = default_factory(threads)
    if fault_rate > 0:
        logger.warning("TESTING: %.2f%% of operators will fail (--fault-rate)", 100 * fault_rate)
        factory = faulty(factory, fault_rate)
    return factory
