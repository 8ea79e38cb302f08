"""KV admission, growth, host swap and migration: which blocks of which device each request holds.

Every device has one pool (`models.kv_cache.KVCache` over all layers). A
request reserves blocks on every device of its placement for the tokens it
has (its prompt at admission), and grows them block by block as tokens come
(`can_grow` / `grow`). A layer's KV lives on the device that runs the layer
group holding it (`layer_devices`). A preempted request's KV may move to host
memory within a byte budget (`swap_out`) and back into new blocks on resume
(`swap_in`); a request placed over several devices may gather its KV onto one
(`migrate`). Blocks are freed when a request finishes, aborts or is preempted.

With prefix caching (pools whose allocator is a `models.prefix_cache.CachingAllocator`)
a request's full blocks are registered under their keys once computed (`register`), and
an admission may start from the cached blocks of its prompt's longest cached prefix on
its device: `cached_prefix` (pure) sizes the hit, `pin` takes references to it, and
`reserve` then allocates only the rest. Freeing drops references; a cached block whose
last reference goes stays cached until its space is needed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from models.kv_cache import KVCache, blocks_for
from models.prefix_cache import BlockKey, CachingAllocator
from models.template import GraphTemplate, OpKind

LayerKV = dict[int, tuple[torch.Tensor, torch.Tensor]]  # layer -> (keys, values) of some blocks


def layer_devices(template: GraphTemplate, placement: tuple[str, ...],
                  model: str = "") -> dict[int, str]:
    """Decoder layer -> the device of the placement that runs it (where its KV lives), for
    the chain of `model` (a model set's member; "" for one model)."""
    return {layer: placement[t.index] for t in template.chain(model)
            if t.kind is OpKind.LAYERS for layer in t.layers}


@dataclass(slots=True)
class Reservation:
    """One request's KV: a block table per device (its layer groups' affinity)."""

    tables: dict[str, list[int]] = field(default_factory=dict)  # device -> block ids

    def num_blocks(self, device: str) -> int:
        return len(self.tables.get(device, ()))


@dataclass(slots=True)
class Swapped:
    """A preempted request's KV in host memory: its first `num_tokens` tokens, every layer."""

    num_tokens: int
    kv: LayerKV  # layer -> (keys, values), each [Hkv, blocks, block_size, d] on the host
    num_bytes: int


class KVManager:
    """Per-device pools, per-request reservations, a host swap space. Pure checks beside
    committing actions."""

    def __init__(self, pools: dict[str, KVCache], host_swap_bytes: int = 0) -> None:
        self.pools = pools
        self.reservations: dict[str, Reservation] = {}
        self.swapped: dict[str, Swapped] = {}
        self.host_swap_bytes = host_swap_bytes  # budget of host memory for swapped KV
        self.pinned: dict[str, dict[str, list[int]]] = {}  # rid -> device -> cached blocks
        self._swap_block_bytes: int | None = None  # host bytes of one block (swap_bytes)

    # -- blocks ------------------------------------------------------------------------------
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

    def max_request_tokens(self, watermark: float) -> int:
        """The most tokens (prompt + output) one request's KV can ever reach: the largest
        pool's blocks above its admission watermark (`SchedulerConfig.kv_watermark`).

        NOTE: a preempted request is admitted again with every token it has, and admission
        leaves the watermark free, so a request longer than this could never resume."""
        return max((p.allocator.num_blocks - int(watermark * p.allocator.num_blocks))
                   * p.block_size for p in self.pools.values())

    def reserve(self, request_id: str, devices: set[str], num_tokens: int) -> Reservation:
        """Blocks for `num_tokens` tokens on every device: the ones `pin` took first, then new."""
        if request_id in self.reservations:
            raise ValueError(f"{request_id} already holds KV")
        pinned = self.pinned.get(request_id, {})
        need = {d: self.blocks_needed(d, num_tokens) - len(pinned.get(d, ())) for d in devices}
        if not all(self.can_allocate(d, n) for d, n in need.items()):
            raise MemoryError(f"{request_id}: not enough free KV blocks")
        self._unpin(request_id, keep=devices)
        r = Reservation()
        for d in sorted(devices):
            r.tables[d] = pinned.get(d, []) + self.pools[d].allocator.allocate(need[d])
        self.reservations[request_id] = r
        return r

    def to_grow(self, request_id: str, num_tokens: int) -> dict[str, int]:
        """Device -> blocks the request's tables lack to hold `num_tokens` tokens."""
        r = self.reservations[request_id]
        return {d: n for d, t in r.tables.items()
                if (n := self.blocks_needed(d, num_tokens) - len(t)) > 0}

    def can_grow(self, request_id: str, num_tokens: int) -> bool:
        return all(self.can_allocate(d, n) for d, n in self.to_grow(request_id, num_tokens).items())

    def grow(self, request_id: str, num_tokens: int) -> None:
        """Append blocks so that the request holds `num_tokens` tokens on every device."""
        if not self.can_grow(request_id, num_tokens):
            raise MemoryError(f"{request_id}: not enough free KV blocks to grow")
        r = self.reservations[request_id]
        for d, n in self.to_grow(request_id, num_tokens).items():
            r.tables[d].extend(self.pools[d].allocator.allocate(n))

    def shrink(self, request_id: str, num_tokens: int) -> None:
        """Free the request's blocks past those holding `num_tokens` tokens, on every device
        (rejected drafts' blocks after a verify step, `scheduler.spec`).

        NOTE: those blocks were never registered in the prefix cache: only full blocks of
        verified tokens are (`Requests.cache`)."""
        r = self.reservations.get(request_id)
        if r is None:
            return
        for d, table in r.tables.items():
            keep = self.blocks_needed(d, num_tokens)
            if len(table) > keep:
                self.pools[d].allocator.free(table[keep:])
                del table[keep:]

    def free(self, request_id: str) -> None:
        """Return the request's device blocks and drop any swapped copy."""
        self.swapped.pop(request_id, None)
        self._unpin(request_id)
        r = self.reservations.pop(request_id, None)
        if r is None:
            return
        for d, table in r.tables.items():
            self.pools[d].allocator.free(table)

    # -- prefix cache ------------------------------------------------------------------------
    def caching(self, device: str) -> CachingAllocator | None:
        """`device`'s allocator when it caches prefixes, else None."""
        alloc = self.pools[device].allocator
        return alloc if isinstance(alloc, CachingAllocator) else None

    @property
    def prefix_caching(self) -> bool:
        return any(self.caching(d) is not None for d in self.pools)

    def cached_prefix(self, device: str, keys: list[BlockKey]) -> tuple[int, int]:
        """(blocks of `keys`' longest cached prefix on `device`, how many of those no request
        holds: taking them costs free blocks). Pure."""
        cache = self.caching(device)
        if cache is None:
            return 0, 0
        hit = cache.lookup(keys)
        return len(hit), cache.num_unreferenced(hit)

    def pin(self, request_id: str, device: str, keys: list[BlockKey], num_blocks: int) -> None:
        """Take references to the first `num_blocks` cached blocks of `keys` on `device`, for
        the request's coming `reserve` (so that no allocation evicts them meanwhile)."""
        cache = self.caching(device)
        hit = cache.lookup(keys[:num_blocks]) if cache is not None else []
        if len(hit) < num_blocks or request_id in self.reservations:
            raise ValueError(f"{request_id}: {len(hit)} of {num_blocks} blocks cached on {device}")
        self._unpin(request_id)
        self.pinned[request_id] = {device: cache.acquire(hit)} if cache is not None else {}

    def _unpin(self, request_id: str, keep: set[str] | frozenset[str] = frozenset()) -> None:
        """Release pinned blocks (on devices not in `keep`; the rest go into a reservation)."""
        for d, blocks in self.pinned.pop(request_id, {}).items():
            if d not in keep:
                self.pools[d].allocator.free(blocks)

    def register(self, request_id: str, device: str, keys: list[BlockKey]) -> None:
        """Cache the request's first `len(keys)` blocks on `device` (their KV is written)."""
        cache = self.caching(device)
        r = self.reservations.get(request_id)
        if cache is not None and r is not None and device in r.tables:
            cache.register(keys, r.tables[device])

    def shared_blocks(self, request_id: str) -> tuple[tuple[str, int], ...]:
        """(device, blocks another request holds too): preempting it does not free those."""
        r = self.reservations.get(request_id)
        out = []
        for d, table in sorted(r.tables.items()) if r is not None else ():
            cache = self.caching(d)
            if cache is not None and cache.num_shared and \
                    (n := sum(cache.ref_count(b) > 1 for b in table)):
                out.append((d, n))
        return tuple(out)

    # -- host swap ---------------------------------------------------------------------------
    def swap_bytes(self, num_tokens: int) -> int:
        """Host bytes holding `num_tokens` tokens of KV (whole blocks, every layer)."""
        pool = next(iter(self.pools.values()))
        if self._swap_block_bytes is None:  # NOTE: a sum over every layer's tensors: once
            # NOTE: storage blocks, not the allocator's (a provisioned pool may use fewer)
            self._swap_block_bytes = pool.num_bytes // pool.keys[pool.layers[0]].shape[1]
        return blocks_for(num_tokens, pool.block_size) * self._swap_block_bytes

    @property
    def host_free_bytes(self) -> int:
        return self.host_swap_bytes - sum(s.num_bytes for s in self.swapped.values())

    def can_swap_out(self, num_tokens: int) -> bool:
        return num_tokens > 0 and self.swap_bytes(num_tokens) <= self.host_free_bytes

    def swap_out(self, request_id: str, num_tokens: int, layers: dict[int, str]) -> None:
        """Copy the request's first `num_tokens` tokens of KV to host memory (each layer from
        the device in `layers`), then free its device blocks."""
        if not self.can_swap_out(num_tokens):
            raise MemoryError(f"{request_id}: no host swap space for {num_tokens} tokens")
        kv = self._gather(request_id, num_tokens, layers, torch.device("cpu"))
        self.free(request_id)
        self.swapped[request_id] = Swapped(num_tokens, kv, self.swap_bytes(num_tokens))

    def swap_in(self, request_id: str, devices: set[str], num_tokens: int,
                layers: dict[int, str]) -> Reservation:
        """Reserve blocks for `num_tokens` tokens on `devices` and copy the swapped KV back
        (each layer to the device in `layers`); the host copy is dropped."""
        swapped = self.swapped[request_id]
        r = self.reserve(request_id, devices, num_tokens)
        self._scatter(r, swapped.num_tokens, swapped.kv, layers)
        del self.swapped[request_id]
        return r

    # -- migration ---------------------------------------------------------------------------
    def migrate(self, request_id: str, num_tokens: int, layers: dict[int, str],
                target: str) -> None:
        """Gather the request's KV onto `target` (whose table already covers every layer's
        tokens: each device's pool has all layers) and free its blocks elsewhere."""
        r = self.reservations[request_id]
        away = {layer: d for layer, d in layers.items() if d != target}
        need = self.blocks_needed(target, num_tokens) - r.num_blocks(target)
        if need > 0:
            r.tables[target].extend(self.pools[target].allocator.allocate(need))
        device = self.pools[target].keys[next(iter(layers))].device
        kv = self._gather(request_id, num_tokens, away, device)
        self._scatter(r, num_tokens, kv, dict.fromkeys(kv, target))
        for d in [d for d in r.tables if d != target]:
            self.pools[d].allocator.free(r.tables.pop(d))

    def _gather(self, request_id: str, num_tokens: int, layers: dict[int, str],
                device: torch.device) -> LayerKV:
        r = self.reservations[request_id]
        out: LayerKV = {}
        for d in set(layers.values()):
            blocks = r.tables[d][:self.blocks_needed(d, num_tokens)]
            mine = [layer for layer, dev in layers.items() if dev == d]
            out.update(self.pools[d].gather(mine, blocks, device))
        return out

    def _scatter(self, r: Reservation, num_tokens: int, kv: LayerKV,
                 layers: dict[int, str]) -> None:
        for d in set(layers.values()):
            blocks = r.tables[d][:self.blocks_needed(d, num_tokens)]
            self.pools[d].scatter(blocks, {layer: kv[layer] for layer, dev in layers.items()
                                           if dev == d and layer in kv})

    # -- totals ------------------------------------------------------------------------------
    def usage(self) -> float:
        total = sum(p.allocator.num_blocks for p in self.pools.values())
        return sum(p.allocator.num_used for p in self.pools.values()) / max(1, total)

    def used_blocks(self) -> int:
        return sum(p.allocator.num_used for p in self.pools.values())
