"""The scheduler's side of the executors: device pools, one executor per device, op hand-off."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from concurrent.futures import Future
from typing import Protocol, TypeVar, runtime_checkable

import torch

from executors.cuda import CudaExecutor
from executors.executor import Executor, OnDone, RunOp, link
from executors.memory import MemoryLedger
from executors.runner import ModelRunner
from executors.types import Device, OpInstance, OpState
from models.loader import Model
from scheduler.cost.oprunner import OnDevice
from scheduler.memory.kv import KVManager

T = TypeVar("T")


class ExecutorLike(Protocol):
    busy_s: float
    alive: bool

    def enqueue(self, op: OpInstance) -> None: ...
    def enqueue_many(self, ops: list[OpInstance]) -> None: ...
    def cancel(self, ops: set[OpInstance]) -> list[OpInstance]: ...
    def notify(self) -> None: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...


@runtime_checkable
class Releases(Protocol):
    """An executor whose ops' outputs live elsewhere (a Ray actor) and are dropped there."""

    def release(self, ops: list[OpInstance]) -> None: ...


# NOTE: the loop argument is None: executors call `on_done` on their worker thread, and the
# scheduler hands completions to its event loop itself (`Completions.push`, core/completions.py).
ExecutorFactory = Callable[[Device, RunOp, OnDone, asyncio.AbstractEventLoop | None],
                           ExecutorLike]


def cpu_threads(num_cpu_devices: int) -> int:
    """Intra-op threads of each CPU executor: the cores split between the CPU devices."""
    return max(1, (os.cpu_count() or 1) // max(1, num_cpu_devices))


def default_factory(threads: int) -> ExecutorFactory:
    """Thread executors; CPU devices split the cores between them."""
    def make(device: Device, run_op: RunOp, on_done: OnDone,
             loop: asyncio.AbstractEventLoop | None) -> ExecutorLike:
        if device.kind == "cuda":
            return CudaExecutor(device, run_op, on_done, loop)
        return Executor(device, run_op, on_done, loop, intra_op_threads=threads)
    return make


class Execution:
    """One executor per device plus the runner that executes ops on them."""

    def __init__(self, model: Model, devices: dict[str, Device], kv: KVManager,
                 ledgers: dict[str, MemoryLedger], on_done: OnDone,
                 factory: ExecutorFactory | None = None) -> None:
        self.devices, self.ledgers, self._on_done = devices, ledgers, on_done
        self.runner = ModelRunner(model, devices, kv.pools, ledgers)
        cpu = sum(d.kind == "cpu" for d in devices.values())
        self._factory = factory or default_factory(cpu_threads(cpu))
        self.executors: dict[str, ExecutorLike] = {}

    def start(self) -> None:
        for name, dev in self.devices.items():
            self.executors[name] = self._factory(dev, self.runner, self._on_done, None)
        real = [e for e in self.executors.values() if isinstance(e, Executor)]
        link(real)
        for e in self.executors.values():
            e.start()

    def stop(self) -> None:
        for e in self.executors.values():
            e.stop()

    def enqueue(self, ops: list[OpInstance]) -> None:
        by_dev: dict[str, list[OpInstance]] = {}
        for op in ops:
            by_dev.setdefault(op.device, []).append(op)
        for dev, group in by_dev.items():
            self.executors[dev].enqueue_many(group)

    def retry(self, op: OpInstance) -> None:
        op.state, op.error, op.output, op.start, op.end, op.ready_at = (
            OpState.ISSUED, None, None, None, None, None)
        self.executors[op.device].enqueue(op)

    def cancel(self, ops: list[OpInstance]) -> None:
        by_dev: dict[str, set[OpInstance]] = {}
        for op in ops:
            if not op.state.is_finished and op.state is not OpState.RUNNING:
                by_dev.setdefault(op.device, set()).add(op)
        for dev, group in by_dev.items():
            self.executors[dev].cancel(group)

    def release(self, ops: list[OpInstance]) -> None:
        """A plan is over: give back receive buffers and drop activations."""
        by_dev: dict[str, list[OpInstance]] = {}
        for op in ops:
            by_dev.setdefault(op.device, []).append(op)
        for dev, group in by_dev.items():
            if isinstance(ex := self.executors.get(dev), Releases):
                ex.release(group)
        for op in ops:
            if op.held_bytes:
                self.ledgers[op.device].release("activations", op.held_bytes)
                op.held_bytes = 0
            op.output = None
            op.batch = None

    def on_device(self, device: str) -> OnDevice | None:
        """Runs a timed op on `device`'s executor thread, between its ops (None where the
        executor is not a local thread: fakes, Ray actors)."""
        ex = self.executors.get(device)
        if not isinstance(ex, Executor):
            return None
        return lambda fn: ex.call(fn).result()

    def call_on(self, device: str, fn: Callable[[torch.device], T]) -> Future[T] | None:
        """Run `fn` (given the device's torch device) on `device`'s executor thread before
        its next op; None where the executor is not a local thread (fakes, Ray actors)."""
        ex = self.executors.get(device)
        if not isinstance(ex, Executor):
            return None
        torch_device = self.devices[device].torch_device
        return ex.call(lambda: fn(torch_device))

    def busy_s(self, device: str) -> float:
        return self.executors[device].busy_s if device in self.executors else 0.0

    def alive(self, device: str) -> bool:
        ex = self.executors.get(device)
        return ex is not None and ex.alive

    def down(self) -> set[str]:
        """Devices whose executor is not up (a lost Ray node, a dead worker thread)."""
        return {d for d, e in self.executors.items() if not e.alive}

    @property
    def healthy(self) -> bool:
        """Every executor that cannot come back alive, and some device up."""
        return all(e.alive for e in self.executors.values()
                   if not getattr(e, "recovers", False)) and (
            not self.executors or len(self.down()) < len(self.executors))
