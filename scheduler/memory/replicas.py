"""The replica registry: which devices hold the weights of which operator of the chain.

Every operator (embedding, each layer group, head) has a set of replicas, one
per device that holds its weights. A replica is LOADING while its weights are
copied in (it is counted in memory but takes no work), READY once loaded (new
placements may use it), and DRAINING once its removal is decided: no new
placement uses it, and its memory is freed when no queued op and no request
whose KV lives there still needs it. The last ready replica of an operator is
never removed.

Memory follows the registry: a replica's weight bytes are reserved in its
device's ledger while it exists, and the device's KV pool is limited to what
its budget leaves after them (`LimitedAllocator`), so removing a replica gives
its memory back to KV, and adding one needs that many free KV blocks.

With a model set (models/modelset.py) a device may hold several pools, one per
KV layout of the members running there. An operator's replica then gives up
(and takes back) blocks of its own member's pool on that device (`op_pools`),
while the device's ledger counts every member's weights and pools.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from executors.memory import MemoryLedger
from executors.types import Device
from models.kv_cache import BlockAllocator, KVCache, pool_key
from models.loader import Model
from models.modelset import ModelSet
from models.template import GraphTemplate
from scheduler.config import SchedulerConfig
from scheduler.memory.pools import (
    activation_reserve,
    adapter_reserve,
    block_bytes,
    kv_split,
    pools_on,
    reserve_weights,
)

Holders = tuple[frozenset[str], ...]  # op index -> devices whose replica takes new work


class ReplicaState(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"

    @property
    def takes_work(self) -> bool:
        return self is ReplicaState.READY


class LimitedAllocator(BlockAllocator):
    """A block allocator whose usable blocks (`num_blocks`) may be set below its storage.

    NOTE: the storage tensors are sized once for the whole budget; the limit is what the
    replicas held leave of it, so KV grows and shrinks without reallocating tensors."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)
        self.num_storage_blocks = num_blocks
        self.limit = num_blocks

    @property
    def num_blocks(self) -> int:
        return self.limit

    @num_blocks.setter
    def num_blocks(self, value: int) -> None:  # set once by BlockAllocator.__init__
        self.limit = value

    @property
    def num_free(self) -> int:
        return max(0, min(len(self._free), self.limit - self.num_used))

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= self.num_free

    def can_set_limit(self, limit: int) -> bool:
        return self.num_used <= limit <= self.num_storage_blocks

    def set_limit(self, limit: int) -> None:
        if not self.can_set_limit(limit):
            raise ValueError(f"cannot limit the pool to {limit} blocks: {self.num_used} used, "
                             f"{self.num_storage_blocks} in storage")
        self.limit = limit


@dataclass(frozen=True, slots=True)
class Change:
    """One replica added or removed: operator `index` on `device`."""

    index: int
    device: str


class ReplicaRegistry:
    """Replicas per operator and device, with their memory (see the module docstring)."""

    def __init__(self, template: GraphTemplate, ledgers: Mapping[str, MemoryLedger],
                 pools: Mapping[str, KVCache], held: Mapping[str, Iterable[int]],
                 kv_block_bytes: int, activation_bytes: int = 0,
                 op_pools: Sequence[str] = (), pool_block_bytes: Mapping[str, int] | None = None
                 ) -> None:
        self.template = template
        self.ledgers, self.pools = ledgers, pools  # pools: keyed by `pool_key`
        self.kv_block_bytes = kv_block_bytes  # of the first pool ("")
        self.activation_bytes = activation_bytes  # kept free on every device for activations
        self.op_pools = tuple(op_pools)  # op index -> its model's pool name; (): "" for all
        self.pool_block_bytes = dict(pool_block_bytes or {})  # pool name -> bytes of a block
        self.states: dict[tuple[int, str], ReplicaState] = {
            (i, d): ReplicaState.READY for d, ops in held.items() for i in ops}
        for i in range(len(template.ops)):
            if not self.holders_of(i):
                raise ValueError(f"no device holds {template.ops[i].name}")

    # -- reading -----------------------------------------------------------------------------
    def pool_of(self, index: int, device: str) -> KVCache:
        """The KV pool on `device` whose blocks operator `index`'s weights trade against."""
        return self.pools[pool_key(device, self.op_pools[index] if self.op_pools else "")]

    def block_bytes_of(self, index: int) -> int:
        """Bytes of one block of the pool operator `index`'s weights trade against."""
        pool = self.op_pools[index] if self.op_pools else ""
        return self.pool_block_bytes.get(pool, self.kv_block_bytes)

    def describe(self, device: str) -> list[dict[str, str]]:
        """The replicas on `device`, in chain order: operator name and state (/admin/gmg)."""
        return [{"op": self.template.ops[i].name, "state": self.states[(i, device)].value}
                for i in self.resident(device)]

    def holders_of(self, index: int) -> frozenset[str]:
        """Devices whose replica of operator `index` takes new work."""
        return frozenset(d for (i, d), s in self.states.items() if i == index and s.takes_work)

    def holders(self) -> Holders:
        return tuple(self.holders_of(i) for i in range(len(self.template.ops)))

    def state(self, index: int, device: str) -> ReplicaState | None:
        return self.states.get((index, device))

    def resident(self, device: str) -> list[int]:
        """Operators whose weights are on `device` (any state), in chain order."""
        return sorted(i for (i, d), _ in self.states.items() if d == device)

    def held(self, device: str) -> frozenset[int]:
        """Operators loading or ready on `device` (not draining)."""
        return frozenset(i for (i, d), s in self.states.items()
                         if d == device and s is not ReplicaState.DRAINING)

    def idle_devices(self, devices: Iterable[str]) -> list[str]:
        """Devices holding no replica at all (the unit a cluster could release)."""
        used = {d for _, d in self.states}
        return [d for d in devices if d not in used]

    def count(self, index: int) -> int:
        """Replicas of operator `index` that exist or are loading (not draining)."""
        return sum(1 for (i, _), s in self.states.items()
                   if i == index and s is not ReplicaState.DRAINING)

    # -- adding ------------------------------------------------------------------------------
    def blocks_for_weights(self, index: int) -> int:
        return -(-self.template.ops[index].weight_bytes // self.block_bytes_of(index))

    def can_add(self, index: int, device: str) -> bool:
        """Pure check: not there yet, and its weights fit (in free memory or free KV)."""
        if (index, device) in self.states:
            return False
        return self._room_for(index, device) is not None

    def _room_for(self, index: int, device: str) -> int | None:
        """KV blocks the pool must give up for operator `index`'s weights, or None."""
        ledger, alloc = self.ledgers[device], self.pool_of(index, device).allocator
        nbytes = self.template.ops[index].weight_bytes
        free = ledger.free_bytes - self.activation_bytes
        if nbytes <= free:
            return 0
        short = -(-(nbytes - max(0, free)) // self.block_bytes_of(index))
        if not isinstance(alloc, LimitedAllocator) or not alloc.can_set_limit(alloc.limit - short):
            return None
        return short

    def net_bytes(self, index: int, device: str) -> int:
        """How much more the device's ledger holds once the replica is added (its weights
        less the KV it gives up for them)."""
        short = self._room_for(index, device) or 0
        return max(0, self.template.ops[index].weight_bytes - short * self.block_bytes_of(index))

    def begin_add(self, index: int, device: str) -> None:
        """Reserve the replica's memory (shrinking KV if needed); it is LOADING."""
        if (index, device) in self.states:
            raise ValueError(f"{device} already holds {self.template.ops[index].name}")
        short = self._room_for(index, device)
        if short is None:
            raise MemoryError(f"{device}: no room for {self.template.ops[index].name}")
        if short:
            alloc = self.pool_of(index, device).allocator
            assert isinstance(alloc, LimitedAllocator)
            alloc.set_limit(alloc.limit - short)
            self.ledgers[device].release("kv", short * self.block_bytes_of(index))
        self.ledgers[device].reserve("weights", self.template.ops[index].weight_bytes)
        self.states[(index, device)] = ReplicaState.LOADING

    def finish_add(self, index: int, device: str) -> None:
        """Its weights are loaded: new placements may use it."""
        if self.states.get((index, device)) is not ReplicaState.LOADING:
            raise ValueError(f"{device}: {self.template.ops[index].name} is not loading")
        self.states[(index, device)] = ReplicaState.READY

    # -- removing ----------------------------------------------------------------------------
    def can_remove(self, index: int, device: str) -> bool:
        """Pure check: a ready replica that is not its operator's last ready one."""
        return (self.states.get((index, device)) is ReplicaState.READY
                and len(self.holders_of(index)) > 1)

    def begin_remove(self, index: int, device: str) -> None:
        """Stop placing new work on it; `finish_remove` frees it once nothing needs it."""
        if not self.can_remove(index, device):
            raise ValueError(f"{device}: {self.template.ops[index].name} cannot be removed")
        self.states[(index, device)] = ReplicaState.DRAINING

    def keep(self, index: int, device: str) -> None:
        """Cancel a removal not finished yet: the replica takes work again (no copy)."""
        if self.states.get((index, device)) is not ReplicaState.DRAINING:
            raise ValueError(f"{device}: {self.template.ops[index].name} is not draining")
        self.states[(index, device)] = ReplicaState.READY

    def draining(self) -> list[Change]:
        return [Change(i, d) for (i, d), s in self.states.items() if s is ReplicaState.DRAINING]

    def finish_remove(self, index: int, device: str) -> None:
        """Free a drained replica's weights; the device's KV pool grows back into them."""
        if self.states.get((index, device)) is not ReplicaState.DRAINING:
            raise ValueError(f"{device}: {self.template.ops[index].name} is not draining")
        del self.states[(index, device)]
        ledger, alloc = self.ledgers[device], self.pool_of(index, device).allocator
        ledger.release("weights", self.template.ops[index].weight_bytes)
        per_block = self.block_bytes_of(index)
        if isinstance(alloc, LimitedAllocator):
            grow = min(alloc.num_storage_blocks - alloc.limit,
                       (ledger.free_bytes - self.activation_bytes) // per_block)
            if grow > 0:
                ledger.reserve("kv", grow * per_block)
                alloc.set_limit(alloc.limit + grow)

    def cancel_add(self, index: int, device: str) -> None:
        """A load failed: give its memory back as a removal would."""
        if self.states.get((index, device)) is ReplicaState.LOADING:
            self.states[(index, device)] = ReplicaState.DRAINING
            self.finish_remove(index, device)


Chain = tuple[range, Sequence[str]]  # a model's operator indices and the devices it runs on


def model_chains(model: Model, devices: Sequence[str]) -> list[Chain]:
    """Each model's chain and devices: the whole chain on every device for one model; a
    set's members' chains, each on the devices it runs on."""
    if not isinstance(model, ModelSet):
        return [(range(len(model.template.ops)), tuple(devices))]
    return [(m.chain, tuple(d for d in devices if m.runs_on(d))) for m in model.members]


def initial_holdings(provisioning: str, devices: list[str], num_ops: int,
                     chains: Sequence[Chain] | None = None) -> dict[str, list[int]]:
    """Without provisioning every device holds every operator; with it, the first device of
    each model's chain (`chains`; default: one model on every device) holds one whole
    replica and the others start empty (the provisioner adds what load needs)."""
    if provisioning == "off":
        return {d: list(range(num_ops)) for d in devices}
    held: dict[str, list[int]] = {d: [] for d in devices}
    for chain, runs_on in chains or [(range(num_ops), devices)]:
        held[runs_on[0]] += chain
    return held


def limited_pools(model: Model, devices: list[Device], ledgers: Mapping[str, MemoryLedger],
                  cfg: SchedulerConfig, held: Mapping[str, list[int]]) -> dict[str, KVCache]:
    """KV pools whose storage covers each device's budget less activations, limited to what
    the replicas it holds leave (see `LimitedAllocator`); a device's room split between the
    pools of the models running there as `kv_pools` splits it. Keyed by `pool_key`."""
    t = model.template
    reserve = activation_reserve(model, cfg)
    pools = {}
    for d in devices:
        ledger = ledgers[d.name]
        adapters = adapter_reserve(model, cfg, d.name)
        reserve_weights(ledger, d, sum(t.ops[i].weight_bytes for i in held.get(d.name, ())),
                        "the replicas it starts with")
        ledger.reserve("adapters", adapters)
        here = pools_on(model, d.name)
        sizes = {p: (block_bytes(m, cfg.block_size), share) for p, (m, share) in here.items()}
        usable = kv_split(max(0, min(ledger.free_bytes - reserve,
                                     cfg.kv_cache_bytes or ledger.free_bytes)), sizes)
        storage = usable if cfg.kv_cache_bytes is not None else \
            kv_split(d.memory_bytes - reserve - adapters, sizes)
        for p, (m, _) in here.items():
            if usable[p] < 1:
                raise ValueError(f"{d.name}: {d.memory_bytes / 2**30:.2f} GiB leaves no room "
                                 f"for KV after its weights and {reserve / 2**30:.2f} GiB of "
                                 "activations")
            pool = m.new_kv_cache(storage[p], cfg.block_size, device=d.torch_device)
            alloc = LimitedAllocator(storage[p], cfg.block_size)
            alloc.set_limit(usable[p])
            pool.allocator = alloc
            ledger.reserve("kv", usable[p] * sizes[p][0])
            pools[pool_key(d.name, p)] = pool
    return pools
