"""A remote pool: the allocator here, shape-only storage, copies forwarded to its backend."""

from __future__ import annotations

import pytest
import torch

from executors.remote_kv import LayerKV, RemoteKVCache
from models.kv_cache import KVCache


class Backend:
    def __init__(self, pool: KVCache) -> None:
        self.pool = pool

    def gather_kv(self, layers: list[int], blocks: list[int]) -> LayerKV:
        return self.pool.gather(layers, blocks, torch.device("cpu"))

    def scatter_kv(self, blocks: list[int], kv: LayerKV) -> None:
        self.pool.scatter(blocks, kv)


def test_counts_like_a_local_pool_and_forwards_copies() -> None:
    args = (range(2), 8, 16, 2, 4, torch.float32)
    remote, there = RemoteKVCache(*args), KVCache(*args, torch.device("cpu"))
    assert remote.num_bytes == there.num_bytes and remote.keys[0].device.type == "meta"
    with pytest.raises(RuntimeError, match="no executor"):
        remote.gather([0], [1], torch.device("cpu"))
    remote.backend = Backend(there)
    there.keys[1].normal_()
    kv = remote.gather([1], [2], torch.device("meta"))  # a migration's target: host tensors
    assert kv[1][0].device.type == "cpu" and torch.equal(kv[1][0][:, 0], there.keys[1][:, 2])
    remote.scatter([5], kv)
    assert torch.equal(there.keys[1][:, 5], there.keys[1][:, 2])
