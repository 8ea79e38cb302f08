"""The prefix cache mechanism: hash chain, shared blocks, reference counts, LRU leaf eviction."""

from __future__ import annotations

import random

import pytest

from models.kv_cache import OutOfBlocks
from models.prefix_cache import CachingAllocator, block_keys

BS = 4


def test_keys_chain_over_full_blocks_and_extend():
    tokens = list(range(10))
    keys = block_keys(tokens, BS)
    assert len(keys) == 2  # the third block is not full
    assert block_keys(tokens + [99, 98], BS, parents=keys) == block_keys(tokens + [99, 98], BS)[2:]
    # a block's key depends on everything before it, and on the salt
    assert block_keys([7] + tokens[1:], BS)[1] != keys[1]
    assert block_keys(tokens, BS, salt="a") != keys
    assert block_keys(tokens, BS, salt="a") != block_keys(tokens, BS, salt="b")
    by_adapter = {block_keys(tokens, BS, adapter=a)[1] for a in (None, "a", "b", "")}
    assert len(by_adapter) == 4 and keys[1] in by_adapter  # None is the base model's keys


def _cache(num_blocks: int = 8) -> CachingAllocator:
    return CachingAllocator(num_blocks, BS)


def _admit(a: CachingAllocator, tokens: list[int]) -> list[int]:
    """Hit what is cached, allocate the rest, register every full block (as after a prefill)."""
    keys = block_keys(tokens, BS)
    table = a.acquire(a.lookup(keys[:(len(tokens) - 1) // BS]))
    table += a.allocate(-(-len(tokens) // BS) - len(table))
    a.register(keys, table)
    return table


def test_two_requests_sharing_a_prefix_hold_one_copy():
    a = _cache()
    prefix = list(range(8))
    t1 = _admit(a, prefix + [50, 51, 52])
    t2 = _admit(a, prefix + [60])
    assert t1[:2] == t2[:2] and t1[2] != t2[2]
    assert a.num_used == 4 and a.ref_count(t1[0]) == 2
    a.free(t1)
    assert a.ref_count(t2[0]) == 1 and a.num_used == 3
    a.free(t2)
    assert a.num_used == 0 and a.num_free == 8 and a.num_cached == 2


def test_freed_blocks_stay_cached_and_hit_later():
    a = _cache()
    t1 = _admit(a, list(range(9)))
    blocks = list(t1)
    a.free(t1)
    assert a.lookup(block_keys(list(range(9)), BS)) == blocks[:2]
    t2 = _admit(a, list(range(9)))
    assert t2[:2] == blocks[:2]


def test_exact_repeat_recomputes_its_last_block():
    a = _cache()
    tokens = list(range(8))  # two full blocks
    t1 = _admit(a, tokens)
    a.free(t1)
    t2 = _admit(a, tokens)
    assert a.ref_count(t2[0]) == 1 and t2[1] not in t1  # the last block is computed again


def test_eviction_never_frees_a_referenced_block():
    a = _cache(6)
    held = _admit(a, list(range(8)))  # 2 blocks, referenced
    gone = _admit(a, list(range(100, 116)))  # 4 blocks
    a.free(gone)
    assert a.num_free == 4
    fresh = a.allocate(4)  # evicts every unreferenced block, none of the held ones
    assert not set(fresh) & set(held)
    with pytest.raises(OutOfBlocks):
        a.allocate(1)
    assert a.lookup(block_keys(list(range(8)), BS)) == held


def test_lru_evicts_leaves_first():
    a = _cache(4)
    t = _admit(a, list(range(16)))  # a chain of four cached blocks
    a.free(t)
    a.allocate(1)
    # the tail went first: the first three blocks still hit
    assert len(a.lookup(block_keys(list(range(16)), BS))) == 3
    b = _admit(a, list(range(100, 104)))
    assert len(b) == 1 and len(a.lookup(block_keys(list(range(16)), BS))) == 2


def test_recently_used_prefix_survives():
    a = _cache(4)
    old = _admit(a, list(range(100, 108)))
    a.free(old)
    hot = _admit(a, list(range(8)))
    a.free(hot)
    again = _admit(a, list(range(8)) + [1])  # touches the hot prefix
    a.free(again)
    a.allocate(2)
    assert len(a.lookup(block_keys(list(range(8)), BS))) == 2
    assert a.lookup(block_keys(list(range(100, 108)), BS)) == []


def test_double_free_and_unknown_blocks_raise():
    a = _cache()
    t = a.allocate(2)
    a.free(list(t))
    with pytest.raises(ValueError):
        a.free(list(t))
    with pytest.raises(ValueError):
        a.acquire([3])


def test_random_workload_keeps_counts_and_returns_the_pool():
    rng = random.Random(0)
    a = _cache(32)
    prefixes = [[rng.randrange(50) for _ in range(rng.randrange(4, 20))] for _ in range(4)]
    live: list[list[int]] = []
    for _ in range(400):
        if live and (rng.random() < 0.45 or not a.can_allocate(6)):
            a.free(live.pop(rng.randrange(len(live))))
            continue
        tokens = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randrange(1, 8))]
        keys = block_keys(tokens, BS)
        hit = a.lookup(keys[:(len(tokens) - 1) // BS])
        need = -(-len(tokens) // BS) - len(hit)
        if need + a.num_unreferenced(hit) > a.num_free:
            continue
        table = a.acquire(hit) + a.allocate(need)
        a.register(keys, table)
        live.append(table)
        held = {b for t in live for b in t}
        assert a.num_used == len(held) and a.num_used + a.num_free == 32
        assert all(a.ref_count(b) == sum(t.count(b) for t in live) for b in held)
        assert a.num_shared == sum(a.ref_count(b) > 1 for b in held)
    for t in live:
        a.free(t)
    assert a.num_used == 0 and a.num_free == 32
