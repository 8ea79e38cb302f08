"""The Global Mapping Graph: every operator instance in flight, and the devices they run on.

The GMG is the single source of truth for what is where. `snapshot()` copies
what the simulator needs into immutable records, cheaply, so a what-if run
never sees later mutation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from executors.interference import Interference
from executors.memory import MemoryLedger
from executors.types import Device, OpInstance, OpState, Priority
from models.kv_cache import pool_device
from scheduler.memory.kv import KVManager


class SimOp(NamedTuple):
    """An op instance as the simulator sees it. Times are monotonic seconds.

    NOTE: a named tuple, not a dataclass: every round builds one per op in flight and per
    candidate op, and a tuple is several times cheaper to make.
    """

    op_id: int
    name: str
    device: str
    priority: Priority
    deps: tuple[int, ...]  # unfinished predecessors (ids); finished ones fold into ready_floor
    est_s: float
    ready_floor: float  # earliest ready time: max(issued_at, finished deps' end)
    start: float | None  # set when running
    mem_bytes: int
    first_token_of: tuple[str, ...] = ()  # requests whose first token this op produces
    issued_at: float = 0.0  # when its batch was issued (the dispatch rule orders by it)


@dataclass(frozen=True, slots=True)
class DeviceView:
    name: str
    capacity_bytes: int
    reserved_bytes: int  # weights + KV pool + activations reserved now


@dataclass(frozen=True, slots=True)
class Snapshot:
    now: float
    ops: tuple[SimOp, ...]
    devices: tuple[DeviceView, ...]
    deadlines: tuple[tuple[str, float], ...]  # (request id, TTFT deadline) still pending
    interference: Interference | None = None  # slowdown of ops overlapping on one host
    # NOTE: the simulator keeps what it derives from `ops` here (its graph, built once and
    # shared by every candidate simulated on this snapshot); `replace` starts it empty
    cache: dict[str, Any] = field(init=False, default_factory=dict, repr=False, compare=False)


class GMG:
    """Op instances in flight + device set; the scheduler mutates it, the simulator reads copies."""

    def __init__(self, devices: dict[str, Device], ledgers: dict[str, MemoryLedger],
                 kv: KVManager) -> None:
        self.devices = devices
        self.ledgers = ledgers
        self.kv = kv
        self.unscheduled: dict[int, OpInstance] = {}
        self.scheduled: dict[int, OpInstance] = {}  # issued or running
        self.first_token_of: dict[int, tuple[str, ...]] = {}
        self.deadlines: dict[str, float] = {}  # request id -> TTFT deadline, until first token
        self.interference: Interference | None = None  # set from the estimators' profile

    def add(self, ops: list[OpInstance], first_token_of: dict[int, tuple[str, ...]]) -> None:
        for op in ops:
            self.unscheduled[op.op_id] = op
        self.first_token_of.update(first_token_of)

    def mark_issued(self, op: OpInstance) -> None:
        self.scheduled[op.op_id] = self.unscheduled.pop(op.op_id)

    def finish(self, op: OpInstance) -> None:
        self.scheduled.pop(op.op_id, None)
        self.first_token_of.pop(op.op_id, None)

    def remove(self, ops: list[OpInstance]) -> None:
        for op in ops:
            self.scheduled.pop(op.op_id, None)
            self.unscheduled.pop(op.op_id, None)
            self.first_token_of.pop(op.op_id, None)

    def loads(self) -> dict[str, float]:
        """Device -> estimated seconds of work issued there and not done."""
        out = dict.fromkeys(self.devices, 0.0)
        for op in self.scheduled.values():
            if op.state is not OpState.DONE:
                out[op.device] = out.get(op.device, 0.0) + op.est_s
        return out

    def snapshot(self, now: float) -> Snapshot:
        """The ops not done yet, as simulator records.

        NOTE: an op the executor finished is skipped even before the scheduler has handled
        its completion (completions of ops that end no chunk are handled in batches).
        """
        ops = tuple(self._sim_op(op, now) for op in self.scheduled.values()
                    if op.state is not OpState.DONE)
        devs = tuple(DeviceView(d, self.ledgers[d].capacity_bytes, self.ledgers[d].used_bytes)
                     for d in self.devices)
        return Snapshot(now, ops, devs, tuple(self.deadlines.items()), self.interference)

    def _sim_op(self, op: OpInstance, now: float) -> SimOp:
        floor = op.issued_at or now
        open_deps = []
        for d in op.deps:
            if d.state is OpState.DONE and d.end is not None:
                floor = max(floor, d.end)
            else:
                open_deps.append(d.op_id)
        start = op.start if op.state is OpState.RUNNING else None
        return SimOp(op.op_id, op.name, op.device, op.priority, tuple(open_deps), op.est_s,
                     floor, start, op.mem_bytes, self.first_token_of.get(op.op_id, ()),
                     op.issued_at if op.issued_at is not None else now)

    def to_json(self) -> dict[str, Any]:
        """The /admin/gmg view."""
        devices = []
        for name, dev in self.devices.items():
            # NOTE: a device's pools summed (one per KV layout of the models it runs)
            pools = [p.allocator for k, p in self.kv.pools.items() if pool_device(k) == name]
            devices.append({
                "device": name, "capacity_bytes": dev.memory_bytes,
                "reserved_bytes": self.ledgers[name].snapshot(),
                "kv_blocks_total": sum(a.num_blocks for a in pools),
                "kv_blocks_used": sum(a.num_used for a in pools),
                # blocks holding a cached prefix (referenced or evictable), 0 without the cache
                "kv_blocks_cached": sum(getattr(a, "num_cached", 0) for a in pools),
                # each pool apart, with the models whose KV it holds ("": the only model)
                "kv_pools": [{"models": self.kv.models_of(k), "kv_blocks_total":
                              p.allocator.num_blocks, "kv_blocks_used": p.allocator.num_used}
                             for k, p in self.kv.pools.items() if pool_device(k) == name],
                "queue": [op.op_id for op in self.scheduled.values() if op.device == name],
            })
        ops = [{"op_id": op.op_id, "name": op.name, "role": op.role.value, "device": op.device,
                "priority": op.priority.label, "state": op.state.value,
                "deps": [d.op_id for d in op.deps], "requests": list(op.request_ids),
                "shape": {"num_tokens": op.shape.num_tokens, "num_seqs": op.shape.num_seqs},
                "est_s": op.est_s, "mem_bytes": op.mem_bytes, "start": op.start}
               for op in [*self.scheduled.values(), *self.unscheduled.values()]]
        return {"devices": devices, "ops": ops,
                "unscheduled": list(self.unscheduled), "scheduled": list(self.scheduled)}
