"""The gateway's view of a remote device's KV pool: the block allocator here, the storage there.

The scheduler allocates blocks of every device in its own process (block
tables travel with each batch); the storage of a remote device lives in its
Ray actor. `RemoteKVCache` keeps the allocator and shape-only (`meta`)
tensors, so the byte counts read as for a local pool, and forwards the copies
that swap and migration make (`gather` / `scatter`) to the actor through a
`KVBackend` bound when the executor starts.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import torch

from models.kv_cache import KVCache

LayerKV = dict[int, tuple[torch.Tensor, torch.Tensor]]  # layer -> (keys, values)


class KVBackend(Protocol):
    """Where a remote pool's storage is: the device's actor."""

    def gather_kv(self, layers: list[int], blocks: list[int]) -> LayerKV: ...
    def scatter_kv(self, blocks: list[int], kv: LayerKV) -> None: ...


class RemoteKVCache(KVCache):
    """A `KVCache` whose storage is on another host (see the module doc)."""

    def __init__(self, layers: range, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype) -> None:
        super().__init__(layers, num_blocks, block_size, num_kv_heads, head_dim, dtype,
                         torch.device("meta"))
        self.backend: KVBackend | None = None

    def _remote(self) -> KVBackend:
        if self.backend is None:
            raise RuntimeError("the remote KV pool has no executor bound yet")
        return self.backend

    def gather(self, layers: Iterable[int], blocks: list[int], device: torch.device) -> LayerKV:
        # NOTE: a `meta` target (another remote pool, in a migration) takes host tensors
        dst = torch.device("cpu") if device.type == "meta" else device
        kv = self._remote().gather_kv(list(layers), list(blocks))
        return {layer: (k.to(dst), v.to(dst)) for layer, (k, v) in kv.items()}

    def scatter(self, blocks: list[int], kv: LayerKV) -> None:
        host = {layer: (k.cpu(), v.cpu()) for layer, (k, v) in kv.items()}
        self._remote().scatter_kv(list(blocks), host)
