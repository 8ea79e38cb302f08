"""Each device's memory at start-up: weights and an activation reserve first, KV in the rest."""

from __future__ import annotations

from collections.abc import Mapping

from executors.memory import MemoryLedger
from executors.remote_kv import RemoteKVCache
from executors.types import Device
from models.batch import BatchShape
from models.kv_cache import KVCache, pool_key
from models.loader import Model
from models.modelset import ModelSet
from models.prefix_cache import CachingAllocator
from scheduler.config import SchedulerConfig


def activation_reserve(model: Model, cfg: SchedulerConfig) -> int:
    """Bytes kept for activations: a full prefill plan and a full decode plan in flight."""
    t = model.template
    prefill = BatchShape(cfg.max_batch_tokens, 1, 1, cfg.max_batch_tokens ** 2,
                         cfg.max_batch_tokens)
    decode = BatchShape(cfg.max_decode_seqs, cfg.max_decode_seqs, cfg.max_decode_seqs,
                        cfg.max_decode_seqs * cfg.max_model_len,
                        cfg.max_decode_seqs * cfg.max_model_len)
    return 2 * max(o.activation_bytes(s) for o in t.ops for s in (prefill, decode))


def adapter_reserve(model: Model, cfg: SchedulerConfig, device: str | None = None) -> int:
    """Bytes kept on `device` for LoRA adapters: per model running there, the configured
    reserve, or what its adapters loaded already take when that is more. Each model's adapter
    set is held to its own reserve (a set's members each to theirs; None: every member)."""
    members = [m.model for m in model.members if device is None or m.runs_on(device)] \
        if isinstance(model, ModelSet) else [model]
    total = 0
    for m in members:
        reserve = max(cfg.lora_reserve_bytes, m.adapters.memory_bytes())
        m.adapters.limit(reserve)
        total += reserve
    return total


def reserve_weights(ledger: MemoryLedger, device: Device, weights: int, note: str) -> None:
    """Count the weights `device` holds; ValueError with the numbers when they do not fit."""
    if not ledger.try_reserve("weights", weights):
        raise ValueError(f"{device.name}: {device.memory_bytes / 2**30:.2f} GiB cannot hold "
                         f"{weights / 2**30:.2f} GiB of weights ({note}); raise the budget "
                         "or run fewer models there")


def check_weights(model: Model, devices: list[Device]) -> None:
    """ValueError, with the numbers, when a device cannot hold the weights it would run
    (before minutes of profiling; `kv_pools` counts them again with the rest)."""
    for d in devices:
        reserve_weights(MemoryLedger(d.memory_bytes), d, model.weight_bytes_on(d.name),
                        model.weights_note(d.name))


def kv_split(room_bytes: int, pools: Mapping[str, tuple[int, float]]) -> dict[str, int]:
    """pool -> KV blocks, for `pools` (pool -> (bytes of one block, share)) splitting one
    device's `room_bytes`: each pool's bytes are proportional to its share times its bytes
    per block, so that equal shares hold equal numbers of tokens. Pure."""
    weights = {p: per_block * share for p, (per_block, share) in pools.items()}
    total = sum(weights.values())
    return {p: int(room_bytes * weights[p] / total) // per_block
            for p, (per_block, _) in pools.items()}


def pools_on(model: Model, device: str) -> dict[str, tuple[Model, float]]:
    """pool -> (the model of its geometry, its share) on `device` (one pool for one model)."""
    return model.pools_on(device) if isinstance(model, ModelSet) else {"": (model, 1.0)}


def block_bytes(model: Model, block_size: int) -> int:
    """Bytes of one KV block of `model` over every layer."""
    c = model.config
    return KVCache.bytes_per_block(c.num_layers, block_size, c.num_kv_heads, c.head_dim,
                                   model.dtype)


def kv_pools(model: Model, devices: list[Device], ledgers: dict[str, MemoryLedger],
             cfg: SchedulerConfig) -> dict[str, KVCache]:
    """Reserve weights and activations on every device; the rest of its budget is KV, split
    between the pools of the models running there (`kv_split`). Keyed by `pool_key`."""
    reserve = activation_reserve(model, cfg)
    pools: dict[str, KVCache] = {}
    for d in devices:
        ledger = ledgers[d.name]
        adapters = adapter_reserve(model, cfg, d.name)
        # NOTE: virtual CPU devices share one copy of the weights but each counts it, as GPUs do
        weights = model.weight_bytes_on(d.name)
        reserve_weights(ledger, d, weights, model.weights_note(d.name))
        if not ledger.try_reserve("adapters", adapters):
            raise ValueError(f"{d.name}: {d.memory_bytes / 2**30:.2f} GiB holds "
                             f"{weights / 2**30:.2f} GiB of weights; the "
                             f"LoRA reserve of {adapters / 2**30:.2f} GiB does not fit")
        room = max(0, ledger.free_bytes - reserve)
        here = pools_on(model, d.name)
        split = kv_split(min(room, cfg.kv_cache_bytes or room),
                         {p: (block_bytes(m, cfg.block_size), share)
                          for p, (m, share) in here.items()})
        for p, num_blocks in split.items():
            if num_blocks < 1:
                raise ValueError(
                    f"{d.name}: {d.memory_bytes / 2**30:.2f} GiB leaves no room for KV"
                    f"{_of(p, model)} after {weights / 2**30:.2f} GiB of weights and "
                    f"{reserve / 2**30:.2f} GiB of activations; raise the budget")
            pools[pool_key(d.name, p)] = _pool(here[p][0], d, num_blocks, cfg)
            ledger.reserve("kv", pools[pool_key(d.name, p)].num_bytes)
    return pools


def _of(pool: str, model: Model) -> str:
    """` of model X` for a message about a pool of a model set's member."""
    if not isinstance(model, ModelSet):
        return ""
    names = [m.name for m in model.members if m.pool == pool]
    return f" of model {', '.join(repr(n) for n in names)}"


def _pool(model: Model, d: Device, num_blocks: int, cfg: SchedulerConfig) -> KVCache:
    """A pool of `num_blocks` blocks of `model`'s geometry on `d`."""
    pool: KVCache
    if d.node is not None:  # NOTE: a remote device's storage is in its actor
        c = model.config
        pool = RemoteKVCache(range(c.num_layers), num_blocks, cfg.block_size,
                             c.num_kv_heads, c.head_dim, model.dtype)
    else:
        pool = model.new_kv_cache(num_blocks, cfg.block_size, device=d.torch_device)
    if cfg.prefix_caching:
        pool.allocator = CachingAllocator(num_blocks, cfg.block_size)
    return pool
