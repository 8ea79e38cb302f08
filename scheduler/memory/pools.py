"""Each device's memory at start-up: weights and an activation reserve first, KV in the rest."""

from __future__ import annotations

from executors.memory import MemoryLedger
from executors.remote_kv import RemoteKVCache
from executors.types import Device
from models.batch import BatchShape
from models.kv_cache import KVCache
from models.loader import Model
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


def adapter_reserve(model: Model, cfg: SchedulerConfig) -> int:
    """Bytes kept on each device for LoRA adapters: the configured reserve, or what the
    adapters loaded already take when that is more. The model's adapter set is held to it."""
    reserve = max(cfg.lora_reserve_bytes, model.adapters.memory_bytes())
    model.adapters.limit(reserve)
    return reserve


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


def kv_pools(model: Model, devices: list[Device], ledgers: dict[str, MemoryLedger],
             cfg: SchedulerConfig) -> dict[str, KVCache]:
    """Reserve weights and activations on every device; the rest of its budget is KV."""
    c = model.config
    per_block = KVCache.bytes_per_block(c.num_layers, cfg.block_size, c.num_kv_heads,
                                        c.head_dim, model.dtype)
    reserve = activation_reserve(model, cfg)
    adapters = adapter_reserve(model, cfg)
    pools: dict[str, KVCache] = {}
    for d in devices:
        ledger = ledgers[d.name]
        # NOTE: virtual CPU devices share one copy of the weights but each counts it, as GPUs do
        weights = model.weight_bytes_on(d.name)
        reserve_weights(ledger, d, weights, model.weights_note(d.name))
        if not ledger.try_reserve("adapters", adapters):
            raise ValueError(f"{d.name}: {d.memory_bytes / 2**30:.2f} GiB holds "
                             f"{weights / 2**30:.2f} GiB of weights; the "
                             f"LoRA reserve of {adapters / 2**30:.2f} GiB does not fit")
        room = ledger.free_bytes - reserve
        num_blocks = min(room, cfg.kv_cache_bytes or room) // per_block
        if num_blocks < 1:
            raise ValueError(f"{d.name}: {d.memory_bytes / 2**30:.2f} GiB leaves no room for KV "
                             f"after {weights / 2**30:.2f} GiB of weights and "
                             f"{reserve / 2**30:.2f} GiB of activations; raise the budget")
        if d.node is not None:  # NOTE: a remote device's storage is in its actor
            c = model.config
            pools[d.name] = RemoteKVCache(range(c.num_layers), int(num_blocks), cfg.block_size,
                                          c.num_kv_heads, c.head_dim, model.dtype)
        else:
            pools[d.name] = model.new_kv_cache(int(num_blocks), cfg.block_size,
                                               device=d.torch_device)
        if cfg.prefix_caching:
            pools[d.name].allocator = CachingAllocator(int(num_blocks), cfg.block_size)
        ledger.reserve("kv", pools[d.name].num_bytes)
    return pools
