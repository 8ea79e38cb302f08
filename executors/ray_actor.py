"""The Ray actor behind one remote device: the model's operators, the device's KV pool, and
the outputs of the ops it ran, kept until their plan is released.

The proxy in the gateway process (executors/ray_executor.py) keeps the queue
and hands the actor one op at a time; the actor's other methods (ping, the
pull of a transfer, KV copies, release) may run beside that op on the
actor's spare threads. On a restart Ray runs `__init__` again (the weights
load afresh); the proxy then calls `configure` before the device is used.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import torch

from models.batch import Batch, SeqSpec, build_batch
from models.choices import KernelChoice
from models.cpu import keep_threads
from models.kv_cache import KVCache
from models.loader import load

LayerKV = dict[int, tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True, slots=True)
class ActorSpec:
    """What an actor loads: the model as the gateway loaded it, on `device` of its node."""

    model: str  # models.load spec (a folder must exist at this path on the node)
    dtype: str
    layers_per_group: int
    device: str  # the local name on the node: cpu:0, cuda:1
    threads: int  # intra-op threads of a CPU device
    kernels: dict[str, Any] | None = None  # the gateway's CPU kernels; None: measure here


class DeviceActor:
    """One device of one node (see the module doc)."""

    def __init__(self, spec: ActorSpec) -> None:
        keep_threads(spec.threads)
        self.device = torch.device("cpu" if spec.device.startswith("cpu") else spec.device)
        choice = None if spec.kernels is None else KernelChoice.from_dict(spec.kernels)
        self.model = load(spec.model, dtype=spec.dtype, device=self.device,
                          layers_per_group=spec.layers_per_group, kernel_choice=choice,
                          threads=spec.threads)
        self.ops = self.model.ops_on(self.device)
        self.kv: KVCache | None = None
        self.outputs: dict[int, torch.Tensor] = {}  # op id -> output tensor
        self.batches: dict[int, Batch] = {}  # batch key -> tensors built here

    def configure(self, num_blocks: int, block_size: int) -> int:
        """Allocate the device's KV pool (as the gateway's allocator sized it); its bytes."""
        self.kv = self.model.new_kv_cache(num_blocks, block_size, device=self.device)
        self.outputs.clear()
        self.batches.clear()
        return self.kv.num_bytes

    def ping(self) -> tuple[str, int]:
        """(node id, pid): the actor is up, and where."""
        import ray  # NOTE: only actors import ray; this module loads without it for tests

        return ray.get_runtime_context().get_node_id(), os.getpid()

    def compute(self, op_id: int, index: int, key: int, seqs: list[SeqSpec] | None,
                block_size: int, src: int | None, keep: bool) -> tuple[float, Any]:
        """Run operator `index` on batch `key` (built from `seqs` the first time) with the
        output of op `src` as input; keep the output for later ops, else return it.
        Returns (seconds the operator took here, output or None)."""
        batch = self.batches.get(key)
        if batch is None:
            if seqs is None:
                raise RuntimeError(f"batch {key} is unknown here (the actor restarted)")
            batch = self.batches[key] = build_batch(seqs, block_size, self.device)
        x = None if src is None else self.outputs[src]
        t0 = time.perf_counter()
        out = self.ops[index].run(batch, x, self.kv)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        took = time.perf_counter() - t0
        if keep:
            self.outputs[op_id] = out
            return took, None
        return took, out.cpu()

    def fetch(self, op_id: int) -> tuple[torch.Tensor, int]:
        """The output of `op_id` for a transfer (on the host), and its bytes."""
        out = self.outputs[op_id].cpu()
        return out, out.numel() * out.element_size()

    def pull(self, op_id: int, x: torch.Tensor) -> int:
        """Keep `x` (a transfer's tensor, resolved by Ray from the source node) as the
        output of RECV `op_id`; returns its bytes."""
        self.outputs[op_id] = x.to(self.device)
        return x.numel() * x.element_size()

    def release(self, op_ids: list[int], keys: list[int]) -> None:
        for i in op_ids:
            self.outputs.pop(i, None)
        for k in keys:
            self.batches.pop(k, None)

    def gather_kv(self, layers: list[int], blocks: list[int]) -> LayerKV:
        assert self.kv is not None, "configure first"
        return self.kv.gather(layers, blocks, torch.device("cpu"))

    def scatter_kv(self, blocks: list[int], kv: LayerKV) -> None:
        assert self.kv is not None, "configure first"
        self.kv.scatter(blocks, kv)

    def stage(self, op_id: int, num_tokens: int) -> int:
        """Keep a `[num_tokens, hidden]` activation as op `op_id`'s output (transfer
        profiling); returns its bytes."""
        x = torch.ones(num_tokens, self.model.config.hidden_size, dtype=self.model.dtype,
                       device=self.device)
        self.outputs[op_id] = x
        return x.numel() * x.element_size()

    def echo(self, x: Any) -> int:
        """A no-op round trip (overhead and transfer measurements)."""
        return 0 if x is None else 1
