"""Paged KV cache: storage tensors per device and the block allocator.

Storage for layer l is two tensors `[num_kv_heads, num_blocks, block_size,
head_dim]` (keys, values): head-major, so gathering a batch's blocks yields
`[Hkv, B, C, d]` ready for batched matmuls without a transpose copy. A
request owns a block table (block ids, in order); token position p of the request lives in slot
`block_table[p // block_size] * block_size + p % block_size`. Operators read
and write storage through slots and never allocate.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold `num_tokens` tokens."""
    return -(-num_tokens // block_size)


def pool_key(device: str, pool: str = "") -> str:
    """The key of a KV pool: `device` for its first pool (the only one of a server of one KV
    layout), `device#pool` for the pool of another layout there (models/modelset.py)."""
    return f"{device}#{pool}" if pool else device


def pool_device(key: str) -> str:
    """The device of a pool key."""
    return key.partition("#")[0]


class OutOfBlocks(RuntimeError):
    """`allocate`/`append` was called without a successful `can_*` check."""


class BlockAllocator:
    """Hands out KV blocks of one device's pool. Pure checks beside committing actions."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        # NOTE: a stack, so recently freed (cache-warm) blocks are reused first.
        self._free = list(range(num_blocks - 1, -1, -1))
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return len(self._used)

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= len(self._free)

    def allocate(self, num_blocks: int) -> list[int]:
        if not self.can_allocate(num_blocks):
            raise OutOfBlocks(f"asked for {num_blocks} blocks, {len(self._free)} free")
        blocks = [self._free.pop() for _ in range(num_blocks)]
        self._used.update(blocks)
        return blocks

    def blocks_to_append(self, block_table: list[int], num_tokens_after: int) -> int:
        """How many blocks `block_table` must grow by to hold `num_tokens_after` tokens."""
        return max(0, blocks_for(num_tokens_after, self.block_size) - len(block_table))

    def can_append(self, block_table: list[int], num_tokens_after: int) -> bool:
        return self.can_allocate(self.blocks_to_append(block_table, num_tokens_after))

    def append(self, block_table: list[int], num_tokens_after: int) -> None:
        """Grow `block_table` in place so it holds `num_tokens_after` tokens."""
        block_table.extend(self.allocate(self.blocks_to_append(block_table, num_tokens_after)))

    def free(self, block_table: list[int]) -> None:
        """Return every block of `block_table` to the pool and empty the table."""
        for b in block_table:
            if b not in self._used:
                raise ValueError(f"block {b} freed twice or never allocated")
            self._used.remove(b)
            self._free.append(b)
        block_table.clear()


class KVCache:
    """KV storage for a set of decoder layers on one device (one pool, one allocator)."""

    def __init__(self, layers: range, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        self.layers = layers
        self.block_size = block_size
        self.allocator = BlockAllocator(num_blocks, block_size)
        shape = (num_kv_heads, num_blocks, block_size, head_dim)
        # keys[l], values[l]: [Hkv, num_blocks, block_size, d]
        self.keys = {layer: torch.zeros(shape, dtype=dtype, device=device) for layer in layers}
        self.values = {layer: torch.zeros(shape, dtype=dtype, device=device) for layer in layers}

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                        dtype: torch.dtype) -> int:
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * block_size * num_kv_heads * head_dim * itemsize

    @property
    def num_bytes(self) -> int:
        tensors = [*self.keys.values(), *self.values.values()]
        return sum(t.numel() * t.element_size() for t in tensors)

    def gather(self, layers: Iterable[int], blocks: list[int], device: torch.device
               ) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """Copies of `blocks` of each layer's keys and values, on `device`.

        layer -> (keys, values), each [Hkv, len(blocks), block_size, d].
        """
        idx = torch.tensor(blocks, dtype=torch.long, device=self.keys[self.layers[0]].device)
        return {layer: (self.keys[layer].index_select(1, idx).to(device),
                        self.values[layer].index_select(1, idx).to(device))
                for layer in layers}

    def scatter(self, blocks: list[int], kv: dict[int, tuple[torch.Tensor, torch.Tensor]]
                ) -> None:
        """Write `kv` (as `gather` returns it) into `blocks` of each of its layers."""
        idx = torch.tensor(blocks, dtype=torch.long, device=self.keys[self.layers[0]].device)
        for layer, (k, v) in kv.items():
            dst_k, dst_v = self.keys[layer], self.values[layer]
            dst_k.index_copy_(1, idx, k.to(dst_k.device))  # [Hkv, nb, bs, d] at blocks
            dst_v.index_copy_(1, idx, v.to(dst_v.device))
