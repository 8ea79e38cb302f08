"""Helpers for executor tests: op chains of a real model split over devices, and a sink."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from executors.executor import Executor, RunOp, link
from executors.memory import MemoryLedger
from executors.runner import ModelRunner
from executors.types import Device, OpInstance, OpRole, OpState, Priority
from models.batch import Batch, BatchShape, BatchSource, SeqSpec, build_batch
from models.kv_cache import KVCache, blocks_for
from models.loader import Model
from models.sampling_params import SamplingParams

_ids = itertools.count()
SHAPE = BatchShape(1, 1, 1, 1, 1)
BLOCK = 16
GREEDY = SamplingParams(temperature=0.0, max_tokens=4)


def plain_op(device: str, priority: Priority = Priority.NORMAL,
             deps: tuple[OpInstance, ...] = (), name: str = "op",
             est_s: float = 0.0) -> OpInstance:
    """A compute op with no model behind it (for run_op fakes)."""
    return OpInstance(next(_ids), name, OpRole.COMPUTE, 0, device, priority, SHAPE, ("r",),
                      deps=deps, est_s=est_s)


class Sink:
    """`on_done` that records completions and lets a test wait for them."""

    def __init__(self) -> None:
        self.done: list[OpInstance] = []
        self.events: list[tuple[str, OpState]] = []  # (name, state) as reported
        self._cond = threading.Condition()

    def __call__(self, op: OpInstance) -> None:
        with self._cond:
            self.done.append(op)
            self.events.append((op.name, op.state))
            self._cond.notify_all()

    def wait(self, pred: Callable[[], bool], timeout_s: float = 60.0) -> None:
        with self._cond:
            assert self._cond.wait_for(pred, timeout_s), "timed out waiting for ops"

    def wait_finished(self, ops: list[OpInstance], timeout_s: float = 60.0) -> None:
        self.wait(lambda: all(op.state.is_finished for op in ops), timeout_s)


def poll(pred: Callable[[], bool], timeout_s: float = 60.0) -> None:
    """Wait for a condition no callback announces (e.g. an op has started)."""
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, "timed out polling"
        time.sleep(0.001)


@contextmanager
def executors(names: list[str], run_op: RunOp, sink: Sink) -> Iterator[dict[str, Executor]]:
    """Started, linked executors (on_done in the worker thread); always stopped."""
    exs = {n: Executor(Device(n, 1 << 40), run_op, sink, None) for n in names}
    link(list(exs.values()))
    try:
        for e in exs.values():
            e.start()
        yield exs
    finally:
        for e in exs.values():
            e.stop()


@dataclass
class Rig:
    """A model with a KV cache and a memory ledger per device, and the runner over them."""

    model: Model
    kv: dict[str, KVCache]
    ledgers: dict[str, MemoryLedger]
    runner: ModelRunner


def make_rig(model: Model, names: list[str], num_blocks: int = 32,
             capacity_bytes: int = 1 << 30) -> Rig:
    devices = {n: Device(n, capacity_bytes) for n in names}
    kv = {n: model.new_kv_cache(num_blocks, BLOCK) for n in names}
    ledgers = {n: MemoryLedger(capacity_bytes) for n in names}
    return Rig(model, kv, ledgers, ModelRunner(model, devices, kv, ledgers))


def chain_ops(model: Model, batch: Batch, placement: list[str],
              priority: Priority = Priority.NORMAL, rid: str = "r") -> list[OpInstance]:
    """One run of the operator chain; a RECV/SEND pair wherever the placement changes."""
    ops: list[OpInstance] = []
    prev: OpInstance | None = None
    for t in model.template.ops:
        dev = placement[t.index]
        op = OpInstance(next(_ids), t.name, OpRole.COMPUTE, t.index, dev, priority, batch.shape,
                        (rid,), batch=BatchSource.of(batch, BLOCK))
        if prev is not None and prev.device != dev:
            nbytes = model.template.ops[prev.template_index].output_bytes(batch.shape)
            recv = OpInstance(next(_ids), "recv", OpRole.RECV, -1, dev, priority, batch.shape,
                              (rid,), input=prev, transfer_bytes=nbytes)
            send = OpInstance(next(_ids), "send", OpRole.SEND, -1, prev.device, priority,
                              batch.shape, (rid,), deps=(prev, recv), input=prev, peer=recv,
                              transfer_bytes=nbytes)
            op.input, op.deps = recv, (send,)
            ops += [recv, send]
        elif prev is not None:
            op.input, op.deps = prev, (prev,)
        ops.append(op)
        prev = op
    return ops


def prompts(model: Model, n: int, length: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, model.config.vocab_size, (length,), generator=g).tolist()
            for _ in range(n)]


def prefill(rig: Rig, prompts: list[list[int]]) -> Batch:
    alloc = rig.kv["cpu:0"].allocator  # NOTE: one id space: every device's pool is equal
    seqs = [SeqSpec(f"r{i}", p, 0, alloc.allocate(blocks_for(len(p) + 8, BLOCK)), sample=True,
                    sampling=GREEDY) for i, p in enumerate(prompts)]
    return build_batch(seqs, BLOCK, torch.device("cpu"))
