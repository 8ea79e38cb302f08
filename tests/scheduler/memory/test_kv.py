"""KVManager: growth block by block, host swap out and in, migration onto one device."""

from __future__ import annotations

import pytest
import torch

from models.kv_cache import KVCache
from scheduler.memory.kv import KVManager, Reservation, layer_devices
from tests.scheduler.cluster import weightless

MODEL = weightless(layers_per_group=2)  # embed, layers[0:2], layers[2:4], head
SPLIT = ("cpu:0", "cpu:0", "cpu:1", "cpu:1")  # layers 0-1 on cpu:0, 2-3 on cpu:1


def _kv(blocks: int = 16, swap_bytes: int = 1 << 30) -> KVManager:
    pools = {d: MODEL.new_kv_cache(blocks, 4) for d in ("cpu:0", "cpu:1")}
    return KVManager(pools, swap_bytes)


def _fill(pool: KVCache, table: list[int], layers: range, tokens: int, salt: float) -> None:
    """Write a recognisable value for each token position into each layer's keys and values."""
    for layer in layers:
        for p in range(tokens):
            b, o = table[p // 4], p % 4
            pool.keys[layer][:, b, o, :] = salt + 100 * layer + p
            pool.values[layer][:, b, o, :] = -(salt + 100 * layer + p)


def _read(pool: KVCache, table: list[int], layer: int, tokens: int) -> list[float]:
    return [float(pool.keys[layer][0, table[p // 4], p % 4, 0]) for p in range(tokens)]


def _split_and_filled(kv: KVManager, tokens: int
                      ) -> tuple[Reservation, dict[int, str], dict[int, list[float]]]:
    """Request "a" placed on `SPLIT`, its KV filled: its reservation, the device of each
    layer, and what each layer's keys hold."""
    r = kv.reserve("a", {"cpu:0", "cpu:1"}, tokens)
    layers = layer_devices(MODEL.template, SPLIT)
    for d in ("cpu:0", "cpu:1"):
        _fill(kv.pools[d], r.tables[d], range(4), tokens, salt=0.5 if d == "cpu:0" else 0.25)
    want = {layer: _read(kv.pools[layers[layer]], r.tables[layers[layer]], layer, tokens)
            for layer in range(4)}
    return r, layers, want


def test_grow_appends_blocks_on_every_device_of_the_placement() -> None:
    kv = _kv()
    r = kv.reserve("a", {"cpu:0", "cpu:1"}, 6)  # 2 blocks of 4
    assert kv.to_grow("a", 8) == {} and kv.to_grow("a", 9) == {"cpu:0": 1, "cpu:1": 1}
    kv.grow("a", 9)
    assert [len(t) for t in r.tables.values()] == [3, 3]
    assert not kv.can_grow("a", 4 * 17)
    with pytest.raises(MemoryError):
        kv.grow("a", 4 * 17)
    kv.free("a")
    assert kv.used_blocks() == 0


def test_swap_out_and_in_keeps_every_layers_kv() -> None:
    kv = _kv()
    r, layers, want = _split_and_filled(kv, 10)
    assert kv.can_swap_out(10)
    kv.swap_out("a", 10, layers)
    assert kv.used_blocks() == 0 and kv.host_free_bytes == (1 << 30) - kv.swap_bytes(10)
    kv.reserve("other", {"cpu:1"}, 12)  # the freed blocks are reused meanwhile
    back = kv.swap_in("a", {"cpu:1"}, 11, layer_devices(MODEL.template, ("cpu:1",) * 4))
    assert back.tables["cpu:1"] != r.tables.get("cpu:1") and len(back.tables["cpu:1"]) == 3
    for layer in range(4):
        assert _read(kv.pools["cpu:1"], back.tables["cpu:1"], layer, 10) == want[layer]
    assert not kv.swapped and kv.host_free_bytes == 1 << 30


def test_swap_needs_host_room() -> None:
    kv = _kv(swap_bytes=0)
    kv.reserve("a", {"cpu:0"}, 8)
    assert not kv.can_swap_out(8)
    with pytest.raises(MemoryError):
        kv.swap_out("a", 8, layer_devices(MODEL.template, ("cpu:0",) * 4))


def test_migration_gathers_the_layers_onto_one_device_and_frees_the_other() -> None:
    kv = _kv()
    r, layers, want = _split_and_filled(kv, 7)
    kv.migrate("a", 7, layers, "cpu:1")
    assert list(r.tables) == ["cpu:1"] and kv.pools["cpu:0"].allocator.num_used == 0
    for layer in range(4):
        assert _read(kv.pools["cpu:1"], r.tables["cpu:1"], layer, 7) == want[layer]
    assert torch.equal(kv.pools["cpu:1"].values[0][0, r.tables["cpu:1"][0], 0],
                       torch.full((16,), -0.5))


def test_the_longest_request_is_the_largest_pool_above_its_watermark() -> None:
    pools = {"cpu:0": MODEL.new_kv_cache(200, 4), "cpu:1": MODEL.new_kv_cache(50, 4)}
    kv = KVManager(pools, 0)
    assert kv.max_request_tokens(0.0) == 200 * 4
    assert kv.max_request_tokens(0.01) == (200 - 2) * 4  # admission leaves 2 blocks free
    assert kv.can_ever_fit(kv.max_request_tokens(0.01))


def test_shrink_frees_the_blocks_past_the_tokens_kept_on_every_device() -> None:
    kv = _kv()
    r = kv.reserve("a", {"cpu:0", "cpu:1"}, 6)
    kv.grow("a", 6 + 5)  # a verify step's drafts: 3 blocks of 4
    head = {d: list(t[:2]) for d, t in r.tables.items()}
    free = {d: p.allocator.num_free for d, p in kv.pools.items()}
    kv.shrink("a", 8)  # the drafts past token 8 were rejected
    assert {d: t for d, t in r.tables.items()} == head  # the same first blocks, in place
    assert {d: p.allocator.num_free for d, p in kv.pools.items()} == \
        {d: n + 1 for d, n in free.items()}
    kv.shrink("a", 8)  # nothing more to free
    kv.shrink("gone", 0)  # a request that ended already
    assert {d: len(t) for d, t in r.tables.items()} == {"cpu:0": 2, "cpu:1": 2}
