"""Fault injection for testing (`--fault-rate`): compute operators that fail at random.

The wrapped executors fail a fraction of compute ops before they run (so a retry is
clean), as a flaky device would; the scheduler's own handling then applies: the op is
retried up to `SchedulerConfig.max_op_attempts`, then its requests end with a clear
error. Never on in production: the server logs a warning when it is.
"""

from __future__ import annotations

import asyncio
import random
import threading

from executors.executor import OnDone, RunOp
from executors.types import Device, OpInstance, OpRole
from scheduler.core.execution import ExecutorFactory, ExecutorLike


class InjectedFault(RuntimeError):
    """The failure `--fault-rate` injects."""


def faulty(factory: ExecutorFactory, rate: float, seed: int | None = None) -> ExecutorFactory:
    """`factory`'s executors, with each compute op failing with probability `rate`."""
    if not 0 <= rate <= 1:
        raise ValueError("the fault rate must be in [0, 1]")
    rng, lock = random.Random(seed), threading.Lock()

    def make(device: Device, run_op: RunOp, on_done: OnDone,
             loop: asyncio.AbstractEventLoop | None) -> ExecutorLike:
        def run(op: OpInstance) -> object:
            if op.role is OpRole.COMPUTE:
                with lock:
                    hit = rng.random() < rate
                if hit:
                    raise InjectedFault(f"injected fault in {op.name} on {device.name}")
            return run_op(op)
        return factory(device, run, on_done, loop)
    return make
