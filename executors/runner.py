"""Runs one op instance: a model operator, or one half of a transfer."""

from __future__ import annotations

from typing import Any

import torch

from executors.memory import MemoryLedger
from executors.types import Device, OpInstance, OpRole
from models.kv_cache import KVCache, pool_key
from models.loader import Model
from models.modelset import ModelSet


class RecvNotReady(Exception):
    """The receiver could not allocate its buffer yet; the executor retries it later."""


class ModelRunner:
    """Executes op instances against one model (or a model set), its KV pools (keyed by
    `pool_key`) and memory ledgers."""

    def __init__(self, model: Model, devices: dict[str, Device], kv: dict[str, KVCache],
                 ledgers: dict[str, MemoryLedger]) -> None:
        self.model = model
        self.devices = devices
        self.kv = kv
        self.ledgers = ledgers
        # (device, op index) -> a replica's own copy of the operator (scheduler/core/actuation.py)
        self.replica_ops: dict[tuple[str, int], Any] = {}

    def __call__(self, op: OpInstance) -> Any:
        if op.role is OpRole.COMPUTE:
            return self._compute(op)
        if op.role is OpRole.RECV:
            return self._recv(op)
        return self._send(op)

    def _compute(self, op: OpInstance) -> Any:
        assert op.batch is not None
        dev = self.devices[op.device].torch_device
        x = op.input.output if op.input is not None else None
        impl = self.replica_ops.get((op.device, op.template_index))
        if impl is None:
            impl = self.model.all_ops_on(dev)[op.template_index]
        return impl.run(op.batch.get(), x, self.kv.get(self._pool_key(op)))

    def _pool_key(self, op: OpInstance) -> str:
        """The key of the KV pool `op` reads: its model's pool on its device (a model set's
        members of another KV layout have pools of their own, models/modelset.py)."""
        if not isinstance(self.model, ModelSet):
            return op.device
        return pool_key(op.device, self.model.of_op(op.template_index).pool)

    def _recv(self, op: OpInstance) -> torch.Tensor:
        # NOTE: the buffer is counted against the destination until the op is released
        assert op.input is not None  # the producer on the source device
        if not self.ledgers[op.device].try_reserve("activations", op.transfer_bytes):
            raise RecvNotReady(f"{op.device}: no room for {op.transfer_bytes} bytes")
        op.held_bytes = op.transfer_bytes
        shape = self.model.template.op(op.input.template_index).output_shape(op.shape)
        model = (self.model.of_op(op.input.template_index).model
                 if isinstance(self.model, ModelSet) else self.model)
        return torch.empty(shape, dtype=model.dtype,
                           device=self.devices[op.device].torch_device)

    def _send(self, op: OpInstance) -> None:
        assert op.input is not None and op.peer is not None
        src: torch.Tensor = op.input.output
        op.peer.output.copy_(src, non_blocking=src.device.type == "cuda")
