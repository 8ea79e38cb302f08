"""Serving from a Ray cluster: `gateway serve --ray-address ADDRESS|auto --devices ...`.

Every device is a Ray actor on some node (executors/ray_cluster.py); the
scheduler runs here over their proxies. Ray is an optional dependency
(`pip install '.[ray]'`): this module imports it only when a cluster is asked for.
"""

from __future__ import annotations

import dataclasses
import logging

from executors.ray_actor import ActorSpec
from gateway.config import ConfigError, GatewayConfig
from models.loader import Model
from scheduler.config import SchedulerConfig
from scheduler.factory import build_scheduler
from scheduler.scheduler import Scheduler

logger = logging.getLogger("gateway")


def ray_scheduler(model: Model, config: GatewayConfig, cfg: SchedulerConfig,
                  memory_gib: float) -> Scheduler:
    """Join the cluster, start one actor per device (each loads the model), build the
    scheduler over them and fit the transfer estimators of every node pair."""
    address = config.scheduler.ray_address
    assert address is not None
    try:
        # NOTE: imported here, not at the top: Ray is an optional extra
        from executors.ray_cluster import RayDevices, connect
    except ImportError as e:
        raise ConfigError(f"--ray-address needs Ray ({e}): pip install '.[ray]'") from None
    connect(address)
    spec = ActorSpec(config.model.spec, config.model.dtype, model.template.layers_per_group,
                     "cpu:0", 1)
    remote = RayDevices.start(list(config.scheduler.devices), int(memory_gib * 2**30), spec)
    # NOTE: no wide plans: an actor's ops run on its own threads, which a hold cannot lend
    sched = build_scheduler(model, remote.devices, dataclasses.replace(cfg, wide_prefill=False),
                            executor_factory=remote.factory)
    est = sched.estimator
    for (src, dst), (sizes, seconds) in remote.profile_pairs().items():
        est.fit_transfer(src, dst, sizes, seconds)
        logger.info("transfers %s -> %s: %s", src, dst, ", ".join(
            f"{b / 1024:.0f} KiB {s * 1e3:.2f} ms" for b, s in zip(sizes, seconds, strict=True)))
    return sched
