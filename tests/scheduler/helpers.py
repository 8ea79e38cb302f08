"""Graphs of op instances for scheduling tests (no model needed)."""

from __future__ import annotations

import random

from executors.memory import MemoryLedger
from executors.types import Device, OpInstance, OpRole, Priority
from models.batch import BatchShape
from scheduler.memory.kv import KVManager
from scheduler.sim.gmg import GMG

SHAPE = BatchShape(8, 1, 1, 64, 8)


def devices(n: int, mem: int = 1 << 30) -> dict[str, Device]:
    return {f"cpu:{i}": Device(f"cpu:{i}", mem) for i in range(n)}


def empty_gmg(devs: dict[str, Device]) -> GMG:
    ledgers = {d: MemoryLedger(dev.memory_bytes) for d, dev in devs.items()}
    return GMG(devs, ledgers, KVManager({}))


def random_graph(seed: int, num_devices: int = 3, num_chains: int = 12) -> list[OpInstance]:
    """Chains of 3-6 ops hopping between devices through RECV/SEND pairs, mixed priorities.

    Durations are multiples of 1/64 s, so sums are exact in binary floating point.
    """
    rng = random.Random(seed)
    ops: list[OpInstance] = []

    def new(role: OpRole, dev: str, prio: Priority, deps: tuple[OpInstance, ...]) -> OpInstance:
        op = OpInstance(len(ops), role.value, role, 0 if role is OpRole.COMPUTE else -1, dev,
                        prio, SHAPE, (f"r{len(ops)}",), deps=deps,
                        est_s=rng.randint(1, 16) / 64, mem_bytes=rng.randint(1, 4) << 20)
        ops.append(op)
        return op

    for _ in range(num_chains):
        prio = rng.choice(list(Priority))
        dev = f"cpu:{rng.randrange(num_devices)}"
        prev = new(OpRole.COMPUTE, dev, prio, ())
        for _ in range(rng.randint(2, 5)):
            nxt = f"cpu:{rng.randrange(num_devices)}"
            if nxt != prev.device:
                recv = new(OpRole.RECV, nxt, prio, ())
                send = new(OpRole.SEND, prev.device, prio, (prev, recv))
                prev = new(OpRole.COMPUTE, nxt, prio, (send,))
            else:
                prev = new(OpRole.COMPUTE, nxt, prio, (prev,))
    return ops
