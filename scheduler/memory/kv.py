"""KV admission, growth, host swap and migration: which blocks of which device each request holds.

Every device has one pool (`models.kv_cache.KVCache` over all layers) per KV
layout of the models running there: a model set's member of another layout than the
first has pools of its own (models/modelset.py), keyed `pool_key(device, pool)`. A
request's blocks are in its model's pools (`model` of `reserve`), every call that
names no request takes the model it asks about ("": the first model, or the only one). A
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

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

import torch

from models.kv_cache import KVCache, blocks_for, pool_device, pool_key
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
    model: str = ""  # the model whose pools hold them

    def num_blocks(self, device: str) -> int:
        return len(self.tables.get(device, ()))


@dataclass(slots=True)
class Swapped:
    """A preempted request's KV in host memory: its first `num_tokens` tokens, every layer."""

    num_tokens: int
    kv: LayerKV  # layer -> (keys, values), each [Hkv, blocks, block_size, d] on the host
    num_bytes: int
    model: str = ""  # the model whose KV it is


class KVManager:
    """Per-device pools, per-request reservations, a host swap space. Pure checks beside
    committing actions."""

    def __init__(self, pools: dict[str, KVCache], host_swap_bytes: int = 0,
                 model_pools: Mapping[str, str] | None = None) -> None:
        self.pools = pools  # pool_key(device, pool) -> its pool
        self.model_pools = dict(model_pools or {})  # model -> its pools' name ("": first)
        self.reservations: dict[str, Reservation] = {}
        self.swapped: dict[str, Swapped] = {}
        self.host_swap_bytes = host_swap_bytes  # budget of host memory for swapped KV
        self.pinned: dict[str, dict[str, list[int]]] = {}  # rid -> device -> cached blocks
        self._pinned_model: dict[str, str] = {}  # rid -> the model of its pinned blocks
        self._swap_block_bytes: dict[str, int] = {}  # pool key -> host bytes of one block

    @property
    def block_size(self) -> int:
        """Tokens per block: the same in every pool."""
        return next(iter(self.pools.values())).block_size

    def key(self, device: str, model: str = "") -> str:
        """The key of `model`'s pool on `device`."""
        return pool_key(device, self.model_pools.get(model, ""))

    def pool(self, device: str, model: str = "") -> KVCache:
        return self.pools[self.key(device, model)]

    @property
    def devices(self) -> list[str]:
        """The devices holding pools, sorted."""
        return sorted({pool_device(k) for k in self.pools})

    def models_of(self, key: str) -> list[str]:
        """The models whose KV the pool of `key` holds ([""] for a server of one model)."""
        if not self.model_pools:
            return [""]
        return [m for m, p in self.model_pools.items() if pool_key(pool_device(key), p) == key]

    def _keys_of(self, model: str | None) -> list[str]:
        """The keys of `model`'s pools (None: every pool)."""
        if model is None:
            return list(self.pools)
        mine = self.model_pools.get(model, "")
        return [k for k in self.pools if k == pool_key(pool_device(k), mine)]

    # -- blocks ------------------------------------------------------------------------------
    def blocks_needed(self, device: str, num_tokens: int) -> int:
        return blocks_for(num_tokens, self.block_size)

    def can_reserve(self, devices: set[str], num_tokens: int, model: str = "") -> bool:
        return all(self.can_allocate(d, self.blocks_needed(d, num_tokens), model)
                   for d in devices)

    def can_allocate(self, device: str, num_blocks: int, model: str = "") -> bool:
        return self.pool(device, model).allocator.can_allocate(num_blocks)

    def can_ever_fit(self, num_tokens: int, model: str = "") -> bool:
        return any(blocks_for(num_tokens, self.block_size) <= self.pools[k].allocator.num_blocks
                   for k in self._keys_of(model))

    def max_request_tokens(self, watermark: float, model: str | None = None) -> int:
        """The most tokens (prompt + output) one request's KV can ever reach: the largest
        pool's blocks above its admission watermark (`SchedulerConfig.kv_watermark`), among
        `model`'s pools (None: every pool).

        NOTE: a preempted request is admitted again with every token it has, and admission
        leaves the watermark free, so a request longer than this could never resume."""
        pools = [self.pools[k] for k in self._keys_of(model)]
        return max((p.allocator.num_blocks - int(watermark * p.allocator.num_blocks))
                   * p.block_size for p in pools)

    def reserve(self, request_id: str, devices: set[str], num_tokens: int,
                model: str = "") -> Reservation:
        """Blocks for `num_tokens` tokens of `model` on every device: the ones `pin` took
        first, then new."""
        if request_id in self.reservations:
            raise ValueError(f"{request_id} already holds KV")
        pinned = self.pinned.get(request_id, {})
        need = {d: self.blocks_needed(d, num_tokens) - len(pinned.get(d, ())) for d in devices}
        if not all(self.can_allocate(d, n, model) for d, n in need.items()):
            raise MemoryError(f"{request_id}: not enough free KV blocks")
        self._unpin(request_id, keep=devices)
        r = Reservation(model=model)
        for d in sorted(devices):
            r.tables[d] = pinned.get(d, []) + self.pool(d, model).allocator.allocate(need[d])
        self.reservations[request_id] = r
        return r

    def to_grow(self, request_id: str, num_tokens: int) -> dict[str, int]:
        """Device -> blocks the request's tables lack to hold `num_tokens` tokens."""
        r = self.reservations[request_id]
        return {d: n for d, t in r.tables.items()
                if (n := self.blocks_needed(d, num_tokens) - len(t)) > 0}

    def can_grow(self, request_id: str, num_tokens: int) -> bool:
        model = self.reservations[request_id].model
        return all(self.can_allocate(d, n, model)
                   for d, n in self.to_grow(request_id, num_tokens).items())

    def grow(self, request_id: str, num_tokens: int) -> None:
        """Append blocks so that the request holds `num_tokens` tokens on every device."""
        if not self.can_grow(request_id, num_tokens):
            raise MemoryError(f"{request_id}: not enough free KV blocks to grow")
        r = self.reservations[request_id]
        for d, n in self.to_grow(request_id, num_tokens).items():
            r.tables[d].extend(self.pool(d, r.model).allocator.allocate(n))

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
                self.pool(d, r.model).allocator.free(table[keep:])
                del table[keep:]

    def free(self, request_id: str) -> None:
        """Return the request's device blocks and drop any swapped copy."""
        self.swapped.pop(request_id, None)
        self._unpin(request_id)
        r = self.reservations.pop(request_id, None)
        if r is None:
            return
        for d, table in r.tables.items():
            self.pool(d, r.model).allocator.free(table)

    # -- prefix cache ------------------------------------------------------------------------
    def caching(self, device: str, model: str = "") -> CachingAllocator | None:
        """The allocator of `model`'s pool on `device` when it caches prefixes, else None."""
        alloc = self.pool(device, model).allocator
        return alloc if isinstance(alloc, CachingAllocator) else None

    @property
    def prefix_caching(self) -> bool:
        return any(isinstance(p.allocator, CachingAllocator) for p in self.pools.values())

    def cached_prefix(self, device: str, keys: list[BlockKey],
                      model: str = "") -> tuple[int, int]:
        """(blocks of `keys`' longest cached prefix in `model`'s pool on `device`, how many of
        those no request holds: taking them costs free blocks). Pure."""
        if self.key(device, model) not in self.pools:
            return 0, 0
        cache = self.caching(device, model)
        if cache is None:
            return 0, 0
        hit = cache.lookup(keys)
        return len(hit), cache.num_unreferenced(hit)

    def pin(self, request_id: str, device: str, keys: list[BlockKey], num_blocks: int,
            model: str = "") -> None:
        """Take references to the first `num_blocks` cached blocks of `keys` in `model`'s pool
        on `device`, for the request's coming `reserve` (so that no allocation evicts them
        meanwhile)."""
        cache = self.caching(device, model)
        hit = cache.lookup(keys[:num_blocks]) if cache is not None else []
        if len(hit) < num_blocks or request_id in self.reservations:
            raise ValueError(f"{request_id}: {len(hit)} of {num_blocks} blocks cached on {device}")
        self._unpin(request_id)
        self.pinned[request_id] = {device: cache.acquire(hit)} if cache is not None else {}
        self._pinned_model[request_id] = model

    def _unpin(self, request_id: str, keep: set[str] | frozenset[str] = frozenset()) -> None:
        """Release pinned blocks (on devices not in `keep`; the rest go into a reservation)."""
        model = self._pinned_model.pop(request_id, "")
        for d, blocks in self.pinned.pop(request_id, {}).items():
            if d not in keep:
                self.pool(d, model).allocator.free(blocks)

    def register(self, request_id: str, device: str, keys: list[BlockKey]) -> None:
        """Cache the request's first `len(keys)` blocks on `device` (their KV is written)."""
        r = self.reservations.get(request_id)
        cache = self.caching(device, r.model) if r is not None else None
        if cache is not None and r is not None and device in r.tables:
            cache.register(keys, r.tables[device])

    def shared_blocks(self, request_id: str) -> tuple[tuple[str, int], ...]:
        """(device, blocks another request holds too): preempting it does not free those."""
        r = self.reservations.get(request_id)
        if r is None:
            return ()
        out = []
        for d, table in sorted(r.tables.items()):
            cache = self.caching(d, r.model)
            if cache is not None and cache.num_shared and \
                    (n := sum(cache.ref_count(b) > 1 for b in table)):
                out.append((d, n))
        return tuple(out)

    # -- host swap ---------------------------------------------------------------------------
    def block_bytes(self, model: str = "") -> int:
        """Host bytes of one block of `model`'s KV (every layer)."""
        key = self._keys_of(model)[0]
        if key not in self._swap_block_bytes:  # NOTE: a sum over every layer's tensors: once
            pool = self.pools[key]
            # NOTE: storage blocks, not the allocator's (a provisioned pool may use fewer)
            self._swap_block_bytes[key] = pool.num_bytes // pool.keys[pool.layers[0]].shape[1]
        return self._swap_block_bytes[key]

    def swap_bytes(self, num_tokens: int, model: str = "") -> int:
        """Host bytes holding `num_tokens` tokens of `model`'s KV (whole blocks, every layer)."""
        return blocks_for(num_tokens, self.block_size) * self.block_bytes(model)

    @property
    def host_free_bytes(self) -> int:
        return self.host_swap_bytes - sum(s.num_bytes for s in self.swapped.values())

    def can_swap_out(self, num_tokens: int, model: str = "") -> bool:
        return num_tokens > 0 and self.swap_bytes(num_tokens, model) <= self.host_free_bytes

    def swap_out(self, request_id: str, num_tokens: int, layers: dict[int, str]) -> None:
        """Copy the request's first `num_tokens` tokens of KV to host memory (each layer from
        the device in `layers`), then free its device blocks."""
        model = self.reservations[request_id].model
        if not self.can_swap_out(num_tokens, model):
            raise MemoryError(f"{request_id}: no host swap space for {num_tokens} tokens")
        kv = self._gather(request_id, num_tokens, layers, torch.device("cpu"))
        self.free(request_id)
        self.swapped[request_id] = Swapped(num_tokens, kv, self.swap_bytes(num_tokens, model),
                                           model)

    def swap_in(self, request_id: str, devices: set[str], num_tokens: int,
                layers: dict[int, str]) -> Reservation:
        """Reserve blocks for `num_tokens` tokens on `devices` and copy the swapped KV back
        (each layer to the device in `layers`); the host copy is dropped."""
        swapped = self.swapped[request_id]
        r = self.reserve(request_id, devices, num_tokens, swapped.model)
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
        pool = self.pool(target, r.model)
        if need > 0:
            r.tables[target].extend(pool.allocator.allocate(need))
        device = pool.keys[next(iter(layers))].device
        kv = self._gather(request_id, num_tokens, away, device)
        self._scatter(r, num_tokens, kv, dict.fromkeys(kv, target))
        for d in [d for d in r.tables if d != target]:
            self.pool(d, r.model).allocator.free(r.tables.pop(d))

    def _gather(self, request_id: str, num_tokens: int, layers: dict[int, str],
                device: torch.device) -> LayerKV:
        r = self.reservations[request_id]
        out: LayerKV = {}
        for d in set(layers.values()):
            blocks = r.tables[d][:self.blocks_needed(d, num_tokens)]
            mine = [layer for layer, dev in layers.items() if dev == d]
            out.update(self.pool(d, r.model).gather(mine, blocks, device))
        return out

    def _scatter(self, r: Reservation, num_tokens: int, kv: LayerKV,
                 layers: dict[int, str]) -> None:
        for d in set(layers.values()):
            blocks = r.tables[d][:self.blocks_needed(d, num_tokens)]
            self.pool(d, r.model).scatter(blocks, {layer: kv[layer] for layer, dev in layers.items()
                                           if dev == d and layer in kv})

    # -- totals ------------------------------------------------------------------------------
    def usage(self, model: str | None = None, devices: Collection[str] | None = None) -> float:
        """Used over total blocks, in [0, 1], of `model`'s pools (None: every pool) on
        `devices` (None: every device)."""
        pools = [self.pools[k] for k in self._keys_of(model)
                 if devices is None or pool_device(k) in devices]
        total = sum(p.allocator.num_blocks for p in pools)
        return sum(p.allocator.num_used for p in pools) / max(1, total)

    def used_blocks(self) -> int:
        return sum(p.allocator.num_used for p in self.pools.values())
