"""Prefix caching beside the paged KV cache: full blocks keyed by a hash chain, shared by count.

A full block of a sequence is keyed by sha256 over (its parent block's key, a
salt, its token ids), the chain of vLLM's automatic prefix caching: equal keys
mean equal tokens at equal positions behind an equal prefix, so equal KV.
`CachingAllocator` is a `BlockAllocator` whose blocks carry reference counts:
`lookup` finds the longest cached prefix of a chain of keys (pure), `acquire`
shares those blocks with one more block table, `register` records a table's
full blocks under their keys, and `free` drops one reference per block. A
block whose last reference goes stays cached ("evictable") until its space is
needed: `allocate` takes never-cached free blocks first, then evicts the least
recently released evictable block that no cached block continues (a leaf).
`num_free` counts evictable blocks as free, so every `can_*` check holds.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence

from models.kv_cache import BlockAllocator, OutOfBlocks

BlockKey = bytes  # sha256 digest of (parent key, salt, token ids of one full block)


def block_keys(token_ids: Sequence[int], block_size: int, salt: str = "",
               parents: Sequence[BlockKey] = (), adapter: str | None = None) -> list[BlockKey]:
    """Keys of the full blocks of `token_ids` after the `len(parents)` blocks already keyed.

    `parents` are the keys of the first blocks (as this function returned them); the result
    continues that chain, so keys can be extended as a sequence grows. A LoRA `adapter`
    changes K/V, so its blocks key apart from the base model's and other adapters'."""
    keys: list[BlockKey] = []
    parent = parents[-1] if parents else b""
    salt_bytes = salt.encode()
    # NOTE: after the block's fixed-width tokens, so no salt can spell an adapter's key
    tail = b"" if adapter is None else (b"\x01" + len(adapter.encode()).to_bytes(4, "little")
                                        + adapter.encode())
    start = len(parents) * block_size
    for begin in range(start, len(token_ids) - block_size + 1, block_size):
        h = hashlib.sha256(parent)
        h.update(len(salt_bytes).to_bytes(4, "little") + salt_bytes)
        h.update(array("q", token_ids[begin:begin + block_size]).tobytes() + tail)
        parent = h.digest()
        keys.append(parent)
    return keys


class CachingAllocator(BlockAllocator):
    """A block allocator with reference counts and a prefix cache (see the module docstring)."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)
        self._refs: dict[int, int] = {}  # block -> tables holding it (>= 1)
        self._key_of: dict[int, BlockKey] = {}  # cached block -> its key
        self._by_key: dict[BlockKey, int] = {}  # key -> cached block
        self._parent: dict[BlockKey, BlockKey | None] = {}  # cached key -> its parent's
        self._children: dict[BlockKey, set[BlockKey]] = {}  # cached key -> cached children
        # NOTE: unreferenced cached blocks, least recently released first
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self.num_evictions = 0
        self.num_shared = 0  # blocks more than one table holds

    # -- counts ------------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks an allocation may take: never-cached free ones and evictable cached ones."""
        return len(self._free) + len(self._evictable)

    @property
    def num_used(self) -> int:
        """Blocks some table references."""
        return len(self._refs)

    @property
    def num_cached(self) -> int:
        """Blocks with a key (referenced or evictable)."""
        return len(self._by_key)

    @property
    def num_evictable(self) -> int:
        return len(self._evictable)

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= self.num_free

    def ref_count(self, block: int) -> int:
        return self._refs.get(block, 0)

    # -- the cache ---------------------------------------------------------------------------
    def lookup(self, keys: Sequence[BlockKey]) -> list[int]:
        """The cached blocks of the longest prefix of `keys` (pure)."""
        out = []
        for key in keys:
            block = self._by_key.get(key)
            if block is None:
                break
            out.append(block)
        return out

    def num_unreferenced(self, blocks: Sequence[int]) -> int:
        """How many of `blocks` no table holds: acquiring them takes that many free blocks."""
        return sum(1 for b in blocks if b in self._evictable)

    def acquire(self, blocks: Sequence[int]) -> list[int]:
        """One more reference to each of `blocks` (cached ones, as `lookup` returned them)."""
        for b in blocks:
            if b not in self._key_of:
                raise ValueError(f"block {b} is not cached")
        for b in blocks:
            self._evictable.pop(b, None)
            n = self._refs[b] = self._refs.get(b, 0) + 1
            self.num_shared += n == 2
        return list(blocks)

    def register(self, keys: Sequence[BlockKey], table: Sequence[int]) -> int:
        """Cache `table`'s first `len(keys)` blocks under `keys` (the chain of its tokens).

        A key cached already (by another block with the same tokens) is left as it is; the
        table's own block then stays uncached. Returns how many blocks became cached."""
        added = 0
        for i, (key, block) in enumerate(zip(keys, table, strict=False)):
            if key in self._by_key or block in self._key_of:
                continue
            if block not in self._refs:
                raise ValueError(f"block {block} is not allocated")
            parent = keys[i - 1] if i else None
            self._by_key[key], self._key_of[block] = block, key
            self._parent[key] = parent if parent in self._by_key else None
            if self._parent[key] is not None:
                self._children.setdefault(parent, set()).add(key)  # type: ignore[arg-type]
            added += 1
        return added

    # -- allocation --------------------------------------------------------------------------
    def allocate(self, num_blocks: int) -> list[int]:
        if not self.can_allocate(num_blocks):
            raise OutOfBlocks(f"asked for {num_blocks} blocks, {self.num_free} free")
        out = []
        for _ in range(num_blocks):
            block = self._free.pop() if self._free else self._evict()
            self._refs[block] = 1
            out.append(block)
        return out

    def free(self, block_table: list[int]) -> None:
        """Drop one reference to every block of `block_table` and empty the table.

        NOTE: released last block first, so that a sequence's tail is evicted before its
        head (the head is what other prompts share)."""
        for b in block_table:
            if b not in self._refs:
                raise ValueError(f"block {b} freed twice or never allocated")
        for b in reversed(block_table):
            n = self._refs[b] - 1
            if n:
                self._refs[b] = n
                self.num_shared -= n == 1
                continue
            del self._refs[b]
            if b in self._key_of:
                self._evictable[b] = None
            else:
                self._free.append(b)
        block_table.clear()

    def _evict(self) -> int:
        """Uncache the least recently released evictable leaf (else the oldest evictable)."""
        victim = next((b for b in self._evictable if not self._children.get(self._key_of[b])),
                      next(iter(self._evictable)))
        del self._evictable[victim]
        key = self._key_of.pop(victim)
        del self._by_key[key]
        parent = self._parent.pop(key)
        if parent is not None and parent in self._children:
            self._children[parent].discard(key)
        for child in self._children.pop(key, ()):
            self._parent[child] = None  # NOTE: unreachable now; evicted in its turn
        self.num_evictions += 1
        return victim
