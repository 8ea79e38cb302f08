"""Carrying out replica changes without stopping traffic, and observing the demand per operator.

`Actuation.add` reserves a replica's memory, copies its operator's weights on a
worker thread (a real copy of every tensor; on a skeleton model there is
nothing to copy) and registers it once loaded, so placements start using it
in the next round while every other op keeps running. `Actuation.remove`
marks a replica draining; `settle` frees it once no op in flight runs there
and no request's KV for that operator lives there. `Demand` counts the op
instances issued per operator (the arrivals a queueing model needs).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from executors.runner import ModelRunner
from executors.types import OpInstance, OpRole
from scheduler.core.state import RequestState
from scheduler.memory.replicas import Change, ReplicaRegistry

logger = logging.getLogger(__name__)


def clone_weights(obj: Any) -> Any:
    """A copy of an operator with every tensor it holds copied (dataclasses and lists walked)."""
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, list):
        return [clone_weights(x) for x in obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = {f.name: clone_weights(getattr(obj, f.name))
                  for f in dataclasses.fields(obj) if f.init}
        return dataclasses.replace(obj, **fields)
    return obj


@dataclass(slots=True)
class Demand:
    """Op instances issued per operator over sliding windows (virtual or real seconds): the
    short one sizes additions, the long one removals."""

    window_s: float = 5.0
    keep_window_s: float = 10.0
    issued: deque[tuple[float, int, float]] = dataclasses.field(default_factory=deque)
    prompts: deque[tuple[float, int]] = dataclasses.field(default_factory=deque)

    def record(self, ops: Iterable[OpInstance], now: float) -> None:
        for op in ops:
            if op.role is OpRole.COMPUTE:
                self.issued.append((now, op.template_index, op.est_s))
                if op.template_index == 0 and op.shape.num_tokens > op.shape.num_seqs:
                    self.prompts.append((now, op.shape.num_tokens))  # a prefill chunk

    def tokens_per_s(self, now: float) -> float:
        """Prompt tokens issued per second over the window."""
        while self.prompts and self.prompts[0][0] < now - max(self.window_s, self.keep_window_s):
            self.prompts.popleft()
        return sum(n for t, n in self.prompts if t >= now - self.window_s) / self.window_s

    def rates(self, now: float, num_ops: int, window_s: float | None = None
              ) -> tuple[list[float], list[float]]:
        """(arrivals per second, mean estimated seconds per op) per operator index, over the
        last `window_s` (default the short window)."""
        window = window_s or self.window_s
        while self.issued and self.issued[0][0] < now - max(self.window_s, self.keep_window_s):
            self.issued.popleft()
        count, work = [0] * num_ops, [0.0] * num_ops
        for t, i, est in self.issued:
            if t >= now - window:
                count[i] += 1
                work[i] += est
        return ([c / window for c in count],
                [w / c if c else 0.0 for w, c in zip(work, count, strict=True)])


class Actuation:
    """Adds and removes replicas for one scheduler (see the module docstring)."""

    def __init__(self, registry: ReplicaRegistry, runner: ModelRunner | None,
                 in_flight: Callable[[], Iterable[OpInstance]],
                 requests: Callable[[], Iterable[RequestState]]) -> None:
        self.registry = registry
        self.runner = runner  # None on a skeleton model: nothing to copy
        self._in_flight = in_flight
        self._requests = requests
        self.actuation_s: list[float] = []  # add -> registered, per added replica (wall time)
        self.failures = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def add(self, index: int, device: str) -> None:
        """Reserve, copy, register. On a failure the memory is given back and it is logged."""
        t0 = time.perf_counter()
        self.registry.begin_add(index, device)
        try:
            if self.runner is not None and self.runner.model.ops:
                src = self.runner.model.ops[index]
                copy = await asyncio.to_thread(clone_weights, src)
                self.runner.replica_ops[(device, index)] = copy
        except Exception:
            logger.exception("loading a replica of op %d on %s failed", index, device)
            self.failures += 1
            self.registry.cancel_add(index, device)
            return
        self.registry.finish_add(index, device)
        self.actuation_s.append(time.perf_counter() - t0)

    def start_add(self, index: int, device: str) -> None:
        """`add` in the background (supervised: its failure is logged by `add` itself)."""
        task = asyncio.get_running_loop().create_task(self.add(index, device))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def remove(self, index: int, device: str) -> None:
        self.registry.begin_remove(index, device)
        self.settle()

    def in_use(self, change: Change) -> bool:
        """Whether an op in flight runs there, or a request's KV for that operator lives there."""
        i, d = change.index, change.device
        if any(op.device == d and op.template_index == i and op.role is OpRole.COMPUTE
               for op in self._in_flight()):
            return True
        return any(s.placement is not None and s.placement[i] == d and not s.finished
                   for s in self._requests())

    def settle(self) -> list[Change]:
        """Free every draining replica nothing needs any more; returns those freed."""
        freed = [c for c in self.registry.draining() if not self.in_use(c)]
        for c in freed:
            self.registry.finish_remove(c.index, c.device)
            if self.runner is not None:
                self.runner.replica_ops.pop((c.device, c.index), None)
        return freed

    @property
    def loading(self) -> int:
        return len(self._tasks)
