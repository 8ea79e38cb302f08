"""The parts of one scheduler, built once from its model, devices and config.

`Scheduler` (scheduler/scheduler.py) adds the request lifecycle on top of them;
the provisioner (scheduler/provisioning/provisioner.py) and the stats
(`stats.collect`) read these parts and nothing of the lifecycle.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from executors.executor import OnDone
from executors.memory import MemoryLedger
from executors.types import Device
from models.loader import Model
from models.modelset import ModelSet
from scheduler.config import SchedulerConfig
from scheduler.core.actuation import Actuation, Demand
from scheduler.core.admission import DrainRate
from scheduler.core.bookkeeping import Bookkeeping
from scheduler.core.execution import Execution, ExecutorFactory
from scheduler.core.fairness import FairShare
from scheduler.core.health import RoundHealth
from scheduler.core.requests import Requests
from scheduler.core.state import RequestState
from scheduler.cost import firstrows
from scheduler.cost.learnlog import LearningLog
from scheduler.cost.reprofile import PairProfiler
from scheduler.memory.kv import KVManager
from scheduler.memory.pools import activation_reserve, kv_pools
from scheduler.memory.replicas import (
    ReplicaRegistry,
    initial_holdings,
    limited_pools,
    model_chains,
)
from scheduler.policies import make_policy
from scheduler.round.calibration import FirstTokenCalibration
from scheduler.round.inflight import InFlight
from scheduler.round.plan import Builder, OpTime, XferTime
from scheduler.sim.gmg import GMG


class Components:
    """See the module docstring. `on_done` is called on an executor's thread per finished op."""

    def __init__(self, model: Model, devices: list[Device], policy: str, op_time: OpTime,
                 xfer_time: XferTime, on_done: OnDone, cfg: SchedulerConfig | None = None,
                 executor_factory: ExecutorFactory | None = None,
                 estimator: Any = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.model, self.cfg = model, cfg or SchedulerConfig(policy=policy)
        self.clock = clock  # monotonic seconds; a virtual clock under fake executors
        self.devices = {d.name: d for d in devices}
        self.policy = make_policy(policy)
        self.estimator = estimator  # observe(op) / mape(), when online refit is on
        self.ledgers = {d.name: MemoryLedger(d.memory_bytes) for d in devices}
        if any(d.node is not None for d in devices):  # NOTE: the actors load their own models
            model.adapters.refuse("LoRA adapters are not supported on Ray executors yet")
        self.model_devices = model_devices(model, list(self.devices), self.cfg)
        self.chains = model_chains(model, list(self.devices))
        held = initial_holdings(self.cfg.provisioning, list(self.devices),
                                len(model.template.ops), self.chains)
        pools = (kv_pools(model, devices, self.ledgers, self.cfg)
                 if self.cfg.provisioning == "off"
                 else limited_pools(model, devices, self.ledgers, self.cfg, held))
        self.kv = KVManager(pools, self.cfg.swap_space_bytes,
                            model.model_pools() if isinstance(model, ModelSet) else None)
        self.replicas = ReplicaRegistry(model.template, self.ledgers, pools, held,
                                        self.kv.swap_bytes(1), activation_reserve(model, self.cfg),
                                        *_op_pools(model, self.kv))
        self.gmg = GMG(self.devices, self.ledgers, self.kv)
        self.requests = Requests(self.kv, self.gmg, model.template, self.cfg.queue_limits)
        self.fair = FairShare()  # virtual token counters per class and tenant
        self.drain = DrainRate()  # prompt tokens served per second (predicts Retry-After)
        self.inflight = InFlight()
        self.first_rows = firstrows.PROCESS  # oneDNN's primitive cache is process-wide
        self.first_rows.configure(model.kernels)
        # what the learners changed, summarised at INFO once a period (the estimators')
        self.learning: LearningLog = getattr(estimator, "learning", None) or LearningLog()
        self.calibration = FirstTokenCalibration(learning=self.learning)  # measured / predicted
        self.builder = Builder(model.template, self.cfg.block_size, op_time, xfer_time,
                               self.first_rows)
        self.exec = Execution(model, self.devices, self.kv, self.ledgers,
                              on_done, executor_factory)
        self.demand = Demand()  # op instances issued per operator (for provisioning)
        gmg = self.gmg
        self.actuation = Actuation(self.replicas, self.exec.runner if model.ops else None,
                                   lambda: [*gmg.scheduled.values(), *gmg.unscheduled.values()],
                                   lambda: self.requests.states.values())
        self.books = Bookkeeping(self.cfg.timeline_size)
        self.health = RoundHealth()
        self.tightest_slo_s: float | None = None  # smallest TTFT SLO among requests seen
        self.profiler: PairProfiler | None = None  # profiles pairs the estimators lack
        self.started_at = clock()  # monotonic s; reset by `Scheduler.start`

    def model_of(self, name: str) -> str:
        """The model a request's `model` names: "" for a one-model scheduler; the member's
        name in a model set ("" = the first). ValueError for one it does not serve."""
        if not isinstance(self.model, ModelSet):
            if name:
                raise ValueError(f"model {name!r} is not served (one unnamed model is)")
            return ""
        try:
            return self.model.member(name).name
        except KeyError:
            raise ValueError(f"model {name!r} is not served") from None

    @property
    def model_names(self) -> list[str]:
        """Every model's `Request.model`: [""] for one model, else each member's name."""
        if not isinstance(self.model, ModelSet):
            return [""]
        return [m.name for m in self.model.members]

    @property
    def states(self) -> dict[str, RequestState]:
        return self.requests.states

    @property
    def kv_fit_tokens(self) -> int:
        """The longest context (prompt + output tokens) one request's KV can hold here."""
        return self.kv.max_request_tokens(self.cfg.kv_watermark)

    def kv_fit_tokens_of(self, model: str) -> int:
        """`kv_fit_tokens` for a request of `model` (its own pools; "": the first model)."""
        return self.kv.max_request_tokens(self.cfg.kv_watermark, self.model_of(model))

    def limit_context(self, max_model_len: int) -> None:
        """Accept requests of at most `max_model_len` tokens (prompt + max_tokens); at most
        `kv_fit_tokens`, which a start-up cap (gateway/context.py) sets it to."""
        if not 2 <= max_model_len <= self.kv_fit_tokens:
            raise ValueError(f"max_model_len must be in [2, {self.kv_fit_tokens}]")
        self.cfg = dataclasses.replace(self.cfg, max_model_len=max_model_len)


def model_devices(model: Model, devices: list[str],
                  cfg: SchedulerConfig) -> dict[str, frozenset[str]]:
    """model -> the devices its requests may run on, for a model set ({} for one model).
    ValueError for a member with no device here, or with whole-model provisioning."""
    if not isinstance(model, ModelSet):
        return {}
    if cfg.provisioning == "model":
        raise ValueError("--provisioning model is not supported with several models; "
                         "use opscale (each model's replicas are sized and placed apart)")
    out = model.devices_of(devices)
    for m in model.members:
        unknown = set(m.devices or ()) - set(devices)
        if unknown or not out[m.name]:
            raise ValueError(f"model {m.name!r} runs on {', '.join(m.devices or ())}: "
                             f"not among the devices {', '.join(devices)}")
    return out


def _op_pools(model: Model, kv: KVManager) -> tuple[tuple[str, ...], dict[str, int]]:
    """A model set's op index -> its member's KV pool name, and pool name -> bytes of one of
    its blocks (the replicas' memory trades against them); ((), {}) for one model."""
    if not isinstance(model, ModelSet):
        return (), {}
    pools = tuple(model.of_op(i).pool for i in range(len(model.template.ops)))
    return pools, {m.pool: kv.block_bytes(m.name) for m in model.members}
