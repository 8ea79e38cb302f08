"""KV admission and affinity: which blocks of which device pool each request holds.

Every device has one pool (`models.kv_cache.KVCache` over all layers). A
request reserves, on each device that runs any of its layer groups, the
blocks for prompt + max_tokens before its prefill is issued, so a running
request never runs out of KV. Blocks are freed when it finishes or aborts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from models.kv_cache import KVCache, blocks_for


@dataclass(slots=True)
class Reservation:
    """One request's KV: a block table per device (its layer groups' affinity)."""

    num_tokens: int  # capacity reserved, in tokens
    tables: dict[str, list[int]] = field(default_factory=dict)  # device -> block ids


class KVManager:
    """Per-device pools plus per-request reservations. Pure checks beside commits."""

    def __init__(self, pools: dict[str, KVCache]) -> None:
        self.pools = pools
        self.reservations: dict[str, Reservation] = {}

    def blocks_needed(self, device: str, num_tokens: int) -> int:
        return blocks_for(num_tokens, self.pools[device].block_size)

    def can_reserve(self, devices: set[str], num_tokens: int) -> bool:
        return all(self.pools[d].allocator.can_allocate(self.blocks_needed(d, num_tokens))
                   for d in devices)

    def can_allocate(self, device: str, num_blocks: int) -> bool:
        return self.pools[device].allocator.can_allocate(num_blocks)

    def can_ever_fit(self, num_tokens: int) -> bool:
        return any(self.blocks_needed(d, num_tokens) <= p.allocator.num_blocks
                   for d, p in self.pools.items())

    def reserve(self, request_id: str, devices: set[str], num_tokens: int) -> Reservation:
        if request_id in self.reservations:
            raise ValueError(f"{request_id} already holds KV")
        if not self.can_reserve(devices, num_tokens):
            raise MemoryError(f"{request_id}: not enough free KV blocks")
        r = Reservation(num_tokens)
        for d in sorted(devices):
            r.tables[d] = self.pools[d].allocator.allocate(self.blocks_needed(d, num_tokens))
        self.reservations[request_id] = r
        return r

    def free(self, request_id: str) -> None:
        r = self.reservations.pop(request_id, None)
        if r is None:
            return
        for d, table in r.tables.items():
            self.pools[d].allocator.free(table)

    def usage(self) -> float:
        total = sum(p.allocator.num_blocks for p in self.pools.values())
        return sum(p.allocator.num_used for p in self.pools.values()) / max(1, total)


    def used_blocks(self) -> int:
        return sum(p.allocator.num_used for p in self.pools.values())
