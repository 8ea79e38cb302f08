"""Build a ready-to-start Scheduler from a model and a device list (gateway, benches)."""

from __future__ import annotations

import torch

from executors.types import Device
from models.loader import Model
from scheduler.config import SchedulerConfig
from scheduler.estimators import Estimators
from scheduler.execution import ExecutorFactory
from scheduler.profiling import load_or_profile
from scheduler.scheduler import Scheduler


def default_devices() -> list[str]:
    """Every GPU, or two virtual CPU devices without one."""
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return [f"cuda:{i}" for i in range(n)] if n else ["cpu:0", "cpu:1"]


def parse_devices(spec: str | list[str] | None, memory_gib: float) -> list[Device]:
    """`cpu:0,cpu:1` (or a list) with one memory budget per device."""
    names = spec.split(",") if isinstance(spec, str) else (spec or default_devices())
    names = [n.strip() for n in names if n.strip()]
    if not names:
        raise ValueError("no devices given")
    if len(set(names)) != len(names):
        raise ValueError(f"devices repeat: {','.join(names)}")
    return [Device(n, int(memory_gib * 2**30)) for n in names]


def build_scheduler(model: Model, devices: list[Device], cfg: SchedulerConfig,
                    estimators: Estimators | None = None,
                    executor_factory: ExecutorFactory | None = None) -> Scheduler:
    """Profile (or load cached) estimators, then make the scheduler; refits stay online."""
    est = estimators or load_or_profile(model, devices)
    return Scheduler(model, devices, cfg.policy, est.op_time, est.transfer_time, cfg,
                     executor_factory=executor_factory, estimator=est)
