"""KV pools per model: a model set's members of another KV layout (layers, KV heads, head
size, dtype) get pools of their own on each device they run on, the device's KV room split
between them (`kv_split`); `KVManager` takes each request's blocks from its model's pool."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from executors.memory import MemoryLedger
from executors.types import Device, Priority
from models.kv_cache import KVCache
from models.modelset import ModelSet, model_set
from models.skeleton import skeleton
from scheduler.config import SchedulerConfig
from scheduler.memory.kv import KVManager
from scheduler.memory.pools import block_bytes, kv_pools, kv_split
from scheduler.policies import POLICIES
from scheduler.policies.common import preempt_for
from scheduler.round.draft import Draft
from tests.scheduler.cluster import CONFIG, ClusterRun, weightless
from tests.scheduler.views import make_view, req

BIG = dataclasses.replace(CONFIG, num_layers=6, num_kv_heads=4)  # another KV layout


def three_models() -> ModelSet:
    """`chat` and `twin` share one layout (one pool a device); `big` (6 layers, 4 KV heads,
    bf16) has its own, on cpu:0 only."""
    return model_set([("chat", weightless(), None), ("twin", weightless(), None),
                      ("big", skeleton(BIG, torch.bfloat16), ("cpu:0",))])


def test_the_split_gives_equal_shares_equal_tokens_within_the_room() -> None:
    split = kv_split(10_000, {"": (100, 1.0), "big": (300, 1.0)})
    assert split == {"": 25, "big": 25}  # 2500 + 7500 bytes: 25 blocks of each
    split = kv_split(10_000, {"": (100, 3.0), "big": (300, 1.0)})
    assert split == {"": 50, "big": 16}  # 3:1 in tokens; what is left over stays unused
    assert 50 * 100 + 16 * 300 <= 10_000
    assert kv_split(999, {"": (100, 1.0)}) == {"": 9}


def test_each_layout_gets_its_own_pools_with_its_geometry_and_the_ledger_counts_all() -> None:
    s = three_models()
    devs = [Device("cpu:0", 64 << 20), Device("cpu:1", 64 << 20)]
    ledgers = {d.name: MemoryLedger(d.memory_bytes) for d in devs}
    cfg = SchedulerConfig(policy="slice", max_model_len=1024, max_batch_tokens=512)
    pools = kv_pools(s, devs, ledgers, cfg)
    assert set(pools) == {"cpu:0", "cpu:0#big", "cpu:1"}  # big runs on cpu:0 only
    big = pools["cpu:0#big"]
    assert list(big.layers) == list(range(6)) and big.keys[0].dtype == torch.bfloat16
    assert big.keys[0].shape[0] == 4 and pools["cpu:0"].keys[0].shape[0] == 2
    per_token = {p: block_bytes(m, cfg.block_size) for p, m in
                 (("cpu:0", weightless()), ("cpu:0#big", s.member("big").model))}
    # chat and twin share their pool: twice big's share of tokens
    tokens = {k: pools[k].allocator.num_blocks for k in per_token}
    assert tokens["cpu:0"] == pytest.approx(2 * tokens["cpu:0#big"], abs=2)
    kv0 = sum(p.num_bytes for k, p in pools.items() if k.startswith("cpu:0"))
    assert ledgers["cpu:0"].used("kv") == kv0 <= ledgers["cpu:0"].capacity_bytes
    assert ledgers["cpu:0"].used("weights") == s.weight_bytes_on("cpu:0")
    assert pools["cpu:1"].allocator.num_blocks > pools["cpu:0"].allocator.num_blocks


def _manager() -> KVManager:
    pools = {"cpu:0": weightless().new_kv_cache(8, 4),
             "cpu:0#big": skeleton(BIG, torch.bfloat16).new_kv_cache(4, 4)}
    return KVManager(pools, 1 << 30, {"chat": "", "twin": "", "big": "big"})


def test_a_requests_blocks_come_from_its_models_pool_and_checks_commit_nothing() -> None:
    kv = _manager()
    assert kv.can_reserve({"cpu:0"}, 16, "big") and not kv.can_reserve({"cpu:0"}, 17, "big")
    assert kv.can_reserve({"cpu:0"}, 32, "chat")
    assert kv.used_blocks() == 0  # the pure checks took nothing
    kv.reserve("b", {"cpu:0"}, 16, "big")
    assert kv.pools["cpu:0#big"].allocator.num_free == 0
    assert kv.pools["cpu:0"].allocator.num_free == 8  # chat's pool is untouched
    assert not kv.can_grow("b", 17) and kv.can_reserve({"cpu:0"}, 32, "twin")
    kv.reserve("c", {"cpu:0"}, 32, "twin")
    assert kv.can_ever_fit(16, "big") and not kv.can_ever_fit(17, "big")
    assert kv.can_ever_fit(32) and kv.max_request_tokens(0.0, "big") == 16
    assert kv.max_request_tokens(0.0) == 32 and kv.devices == ["cpu:0"]
    kv.free("b")
    kv.free("c")
    assert kv.used_blocks() == 0


def test_a_swapped_request_comes_back_into_its_models_pool_with_its_kv() -> None:
    kv = _manager()
    r = kv.reserve("b", {"cpu:0"}, 7, "big")
    pool = kv.pools["cpu:0#big"]
    for layer in range(6):
        pool.keys[layer][:, r.tables["cpu:0"][1], 2, :] = layer + 1.0
    assert kv.swap_bytes(7, "big") == 2 * pool.num_bytes // 4  # its own blocks' bytes
    assert kv.swap_bytes(7, "big") != kv.swap_bytes(7, "chat")
    layers = dict.fromkeys(range(6), "cpu:0")
    kv.swap_out("b", 7, layers)
    assert pool.allocator.num_free == 4 and kv.swapped["b"].model == "big"
    back = kv.swap_in("b", {"cpu:0"}, 7, layers)
    assert pool.allocator.num_free == 2 and kv.reservations["b"].model == "big"
    block = back.tables["cpu:0"][1]
    assert [float(pool.keys[layer][0, block, 2, 0]) for layer in range(6)] == \
        [float(layer + 1) for layer in range(6)]


def test_a_policy_sees_room_per_pool_and_preempts_only_in_the_waiting_models_pool() -> None:
    s = three_models()
    n = len(s.template.ops)
    held = dataclasses.replace(req("low", Priority.LOW, prompt=60, placement=("cpu:0",) * n,
                                   computed=60, blocks=4), model="chat")
    view = dataclasses.replace(make_view(runnable=[held]), num_ops=n,
                               kv_free_blocks={"cpu:0": 0, "cpu:0#big": 2},
                               model_pools=s.model_pools(),
                               model_devices=s.devices_of(["cpu:0"]), kv_watermark_blocks={})
    big = dataclasses.replace(req("hi", Priority.HIGH, prompt=60), model="big")  # 4 blocks
    draft = Draft(view)
    assert draft.room("cpu:0", "big") == 2 and draft.room("cpu:0", "chat") == 0
    assert preempt_for(draft, "cpu:0", big) == 0  # chat's blocks would not help big
    twin = dataclasses.replace(req("t", Priority.HIGH, prompt=30), model="twin")
    assert preempt_for(draft, "cpu:0", twin) == 1  # twin shares chat's pool


async def test_models_of_two_kv_layouts_run_to_the_end_on_one_scheduler() -> None:
    cfg = SchedulerConfig(policy="slice", max_model_len=1024, max_batch_tokens=512)
    async with ClusterRun("slice", model=three_models(), cfg=cfg) as run:
        taken: dict[str, int] = {}
        for key, pool in run.sched.kv.pools.items():  # count what each pool hands out
            allocate = pool.allocator.allocate

            def counted(n: int, key: str = key, allocate: Any = allocate) -> list[int]:
                taken[key] = taken.get(key, 0) + n
                return allocate(n)  # type: ignore[no-any-return]
            pool.allocator.allocate = counted  # type: ignore[method-assign]
        outs = [run.submit(f"b{i}", Priority.HIGH, 40, 4, slo_s=1.0, model="big")
                for i in range(3)]
        outs += [run.submit(f"c{i}", Priority.LOW, 120, 4, model=m)
                 for i, m in enumerate(["chat", "twin", "chat"])]
        await run.run_out()
        assert run.sched.kv.used_blocks() == 0
    assert all(len(o.tokens) == 4 and o.error is None for o in outs)
    # big's 3 prompts of 40 tokens (3 blocks each) in its pool; chat's and twin's not there
    assert taken["cpu:0#big"] == 9 and taken.get("cpu:0", 0) + taken.get("cpu:1", 0) >= 3 * 8
    big_ops = {op.device for op in run.ops if op.name.startswith("big/")}
    assert big_ops == {"cpu:0"}


@pytest.mark.parametrize("policy", sorted(POLICIES))
async def test_every_policy_runs_two_layouts_under_kv_pressure_and_frees_every_block(
        policy: str) -> None:
    # NOTE: 1 MiB of KV a device, split 4:3 by share x bytes per token (chat and twin share
    # one pool); big's (18 blocks) holds one of its requests (10 blocks) at a time
    cfg = SchedulerConfig(policy=policy, max_model_len=1024, max_batch_tokens=512,
                          kv_cache_bytes=1 << 20)
    async with ClusterRun(policy, model=three_models(), cfg=cfg) as run:
        assert run.sched.kv.pools["cpu:0#big"].allocator.num_blocks == 18
        assert run.sched.kv.pools["cpu:0"].allocator.num_blocks == 36
        # NOTE: big runs on cpu:0 only, where `static` puts no low request
        outs = [run.submit(f"b{i}", Priority.HIGH if i % 2 else Priority.NORMAL, 150, 6,
                           model="big") for i in range(6)]
        outs += [run.submit(f"c{i}", Priority.LOW if i % 2 else Priority.NORMAL, 150, 6,
                            model=("chat", "twin")[i % 2]) for i in range(6)]
        await run.run_out()
        kv = run.sched.kv
        assert not kv.reservations and not kv.pinned
        assert all(p.allocator.num_used == 0 and p.allocator.num_free == p.allocator.num_blocks
                   for p in kv.pools.values())
    assert all(len(o.tokens) == 6 and o.error is None for o in outs), \
        [(o.error, len(o.tokens)) for o in outs]


def test_a_pool_too_small_names_its_models() -> None:
    s = model_set([("chat", weightless(), None),
                   ("big", skeleton(BIG, torch.bfloat16), None)], kv_shares={"big": 1e-9})
    devs = [Device("cpu:0", 64 << 20)]
    with pytest.raises(ValueError, match="no room for KV of model 'big'"):
        kv_pools(s, devs, {"cpu:0": MemoryLedger(64 << 20)},
                 SchedulerConfig(policy="slice", max_model_len=1024, max_batch_tokens=512))


def test_kv_cache_pools_have_one_block_size() -> None:
    kv = _manager()
    assert {p.block_size for p in kv.pools.values()} == {kv.block_size} == {4}
    assert isinstance(kv.pool("cpu:0", "big"), KVCache)
    assert kv.pool("cpu:0", "twin") is kv.pools["cpu:0"]
