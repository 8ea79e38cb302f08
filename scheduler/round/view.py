"""What a policy sees of one round: immutable records of requests, KV, devices and the GMG.

The scheduler builds a `RoundView` at the start of every round; a policy reads
it and returns a `RoundDecision` (scheduler/round/decision.py). Nothing in a view
points back into the scheduler's mutable state, so a policy can be tested
with views built by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from executors.types import Priority
from models.kv_cache import blocks_for, pool_key
from scheduler.config import SchedulerConfig
from scheduler.memory.replicas import Holders
from scheduler.round.plan import Builder
from scheduler.round.requestview import Placement, RequestView
from scheduler.sim.gmg import Snapshot


@dataclass(frozen=True, slots=True)
class RoundView:
    """Everything a policy may read in one round (see the module docstring)."""

    now: float  # monotonic seconds (virtual under fake executors)
    cfg: SchedulerConfig
    devices: tuple[str, ...]
    num_ops: int  # operators in the chain
    waiting: Mapping[Priority, tuple[RequestView, ...]]  # not admitted, arrival order per class
    runnable: tuple[RequestView, ...]  # admitted, not in flight, not finished
    running: tuple[RequestView, ...]  # in a plan in flight (they hold KV too)
    # KV pool (`pool_key(device, pool)`: the device itself for one KV layout) -> free blocks
    kv_free_blocks: Mapping[str, int]
    kv_watermark_blocks: Mapping[str, int]  # KV pool -> blocks admission leaves free
    block_size: int  # tokens per KV block
    kv_block_bytes: int  # bytes of one block over every layer (what a swap moves), first model
    host_free_bytes: int  # host swap space left for preempted requests' KV
    snapshot: Snapshot | None  # the GMG (None for policies that do not simulate)
    load_s: Mapping[str, float]  # device -> estimated seconds of work queued or running
    builder: Builder  # the cost model: instantiates plans into op instances with estimates
    prefill_inflight: Mapping[tuple[str, Priority], int]  # (first device, class) -> plans
    decode_inflight: frozenset[Placement]  # placements with a decode step in flight
    tightest_slo_s: float  # smallest TTFT SLO seen, else the default (sizes low chunks)
    # class -> tenant -> virtual tokens served (scheduler/core/fairness.py), for the fair order
    service: Mapping[Priority, Mapping[str, float]] = field(default_factory=dict)
    # op index -> devices holding a replica that takes new work; None: every device holds all
    holders: Holders | None = None
    # placement kind -> measured / predicted first-token wait (scheduler/round/calibration.py);
    # a kind not in it has too few plans scored and counts as 1.0
    first_token_factors: Mapping[str, float] = field(default_factory=dict)
    # (placement, class) of each decode step in flight: a step runs at its lowest member's
    # class, so a high request's step may run at low class (policies/common.py)
    decode_classes: frozenset[tuple[Placement, Priority]] = frozenset()
    # a model set's member -> the devices its requests may run on; {} for one model
    # (models/modelset.py). NOTE: with several models a request runs on one device
    model_devices: Mapping[str, frozenset[str]] = field(default_factory=dict)

    # request id -> op id of the last op of the plan in flight carrying it, for each running
    # request with a TPOT SLO: its next step follows that op (policies/pace.py)
    step_ends: Mapping[str, int] = field(default_factory=dict)
    tightest_tpot_s: float | None = None  # smallest TPOT SLO seen (sizes low chunks); None: none
    # a model set's member -> its KV pools' name ("": the first layout's); {}: one pool a device
    model_pools: Mapping[str, str] = field(default_factory=dict)
    model_block_bytes: Mapping[str, int] = field(default_factory=dict)  # member -> block bytes

    def pool(self, device: str, model: str = "") -> str:
        """The key of `model`'s KV pool on `device` (in `kv_free_blocks`)."""
        return pool_key(device, self.model_pools.get(model, ""))

    def block_bytes(self, model: str = "") -> int:
        """Bytes of one KV block of `model` over every layer."""
        return self.model_block_bytes.get(model, self.kv_block_bytes)

    def may_place(self, req: RequestView, placement: Placement) -> bool:
        """Whether `req`'s model may run on `placement`: always with one model; with several,
        on one device among its model's (`model_devices`) that holds its whole chain (with
        replicas: `holders`)."""
        if not self.model_devices:
            return True
        devices = set(placement)
        return (len(devices) == 1 and devices <= self.model_devices[req.model]
                and self._holds_chain(placement[0], req.model))

    def _holds_chain(self, device: str, model: str) -> bool:
        """Whether `device` holds a replica of every operator of `model`'s chain."""
        return self.holders is None or all(device in self.holders[t.index]
                                           for t in self.builder.template.chain(model))

    def allows(self, placement: Placement) -> bool:
        """Whether every operator of `placement` runs on a device holding its replica."""
        return self.holders is None or all(d in h for d, h in zip(placement, self.holders,
                                                                   strict=True))

    def full_holders(self, model: str | None = None) -> tuple[str, ...]:
        """Devices holding every operator (where a one-device placement may go); of a model
        set, every operator of `model`'s chain (None: of the whole set)."""
        if self.holders is None:
            return self.devices
        if model is not None and self.model_devices:
            return tuple(d for d in self.devices if self._holds_chain(d, model))
        return tuple(d for d in self.devices if all(d in h for h in self.holders))

    def blocks_for(self, num_tokens: int) -> int:
        return blocks_for(num_tokens, self.block_size)
