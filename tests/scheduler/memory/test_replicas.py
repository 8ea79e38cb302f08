import asyncio

import pytest

from executors.memory import MemoryLedger
from executors.types import Device, Priority
from scheduler.api import FinishReason
from scheduler.config import SchedulerConfig
from scheduler.memory.pools import activation_reserve
from scheduler.memory.replicas import (
    LimitedAllocator,
    ReplicaRegistry,
    ReplicaState,
    initial_holdings,
    limited_pools,
)
from tests.scheduler.cluster import ClusterRun, weightless

MEM = 64 << 20


def registry(mem: int = MEM, devices: int = 2) -> ReplicaRegistry:
    model = weightless()
    cfg = SchedulerConfig(max_model_len=1024, max_batch_tokens=512, provisioning="opscale")
    devs = [Device(f"cpu:{i}", mem) for i in range(devices)]
    ledgers = {d.name: MemoryLedger(d.memory_bytes) for d in devs}
    held = initial_holdings("opscale", [d.name for d in devs], len(model.template.ops))
    pools = limited_pools(model, devs, ledgers, cfg, held)
    pool = pools["cpu:0"]
    block = pool.num_bytes // pool.keys[0].shape[1]
    return ReplicaRegistry(model.template, ledgers, pools, held, block,
                           activation_reserve(model, cfg))


def test_first_device_holds_everything_the_others_nothing() -> None:
    reg = registry(devices=3)
    assert all(h == frozenset({"cpu:0"}) for h in reg.holders())
    assert reg.idle_devices(["cpu:0", "cpu:1", "cpu:2"]) == ["cpu:1", "cpu:2"]
    assert not reg.can_remove(1, "cpu:0")  # the last replica stays


def test_add_takes_memory_from_kv_and_remove_gives_it_back() -> None:
    reg = registry()
    alloc = reg.pools["cpu:1"].allocator
    assert isinstance(alloc, LimitedAllocator)
    ledger = reg.ledgers["cpu:1"]
    blocks_before, kv_before = alloc.num_blocks, ledger.used("kv")
    w = reg.template.ops[1].weight_bytes
    reg.begin_add(1, "cpu:1")
    assert reg.state(1, "cpu:1") is ReplicaState.LOADING
    assert "cpu:1" not in reg.holders_of(1)  # not placed on while loading
    assert ledger.used("weights") == w
    assert alloc.num_blocks == blocks_before - reg.blocks_for_weights(1)
    assert ledger.used_bytes <= ledger.capacity_bytes
    reg.finish_add(1, "cpu:1")
    assert reg.holders_of(1) == {"cpu:0", "cpu:1"}
    reg.begin_remove(1, "cpu:1")
    assert reg.holders_of(1) == {"cpu:0"}
    reg.finish_remove(1, "cpu:1")
    assert alloc.num_blocks == blocks_before and ledger.used("kv") == kv_before
    assert ledger.used("weights") == 0


def test_no_room_when_kv_in_use_cannot_shrink() -> None:
    reg = registry()
    alloc = reg.pools["cpu:1"].allocator
    alloc.allocate(alloc.num_free)  # every KV block held by requests
    assert not reg.can_add(1, "cpu:1")
    with pytest.raises(MemoryError):
        reg.begin_add(1, "cpu:1")
    assert reg.ledgers["cpu:1"].used("weights") == 0


def test_cannot_add_twice_or_remove_what_is_not_ready() -> None:
    reg = registry()
    reg.begin_add(2, "cpu:1")
    assert not reg.can_add(2, "cpu:1")
    with pytest.raises(ValueError):
        reg.begin_remove(2, "cpu:1")  # still loading
    reg.cancel_add(2, "cpu:1")
    assert reg.state(2, "cpu:1") is None and reg.ledgers["cpu:1"].used("weights") == 0


def opscale_run(devices: int = 2) -> ClusterRun:
    cfg = SchedulerConfig(policy="slice", max_model_len=1024, max_batch_tokens=512,
                          provisioning="opscale", provision_interval_s=3600)
    return ClusterRun("slice", devices=devices, cfg=cfg)


async def test_placements_use_only_holders() -> None:
    async with opscale_run() as run:
        for i in range(6):
            run.submit(f"r{i}", Priority.HIGH, 200, max_tokens=3, slo_s=5.0)
        await run.run_out()
    assert {op.device for op in run.ops} == {"cpu:0"}
    assert all(o.finish is FinishReason.LENGTH for o in run.outcomes.values())


async def test_add_while_ops_are_in_flight_then_new_work_uses_it() -> None:
    async with opscale_run() as run:
        sched = run.sched
        first = [run.submit(f"a{i}", Priority.HIGH, 300, max_tokens=8, slo_s=5.0)
                 for i in range(4)]
        await run.run_until(0.002)
        assert sched.gmg.scheduled  # ops in flight while the replicas load
        for i in range(len(sched.model.template.ops)):
            sched.actuation.start_add(i, "cpu:1")
        await asyncio.sleep(0)
        await run.run_until(0.004)
        assert all(sched.replicas.state(i, "cpu:1") is ReplicaState.READY
                   for i in range(len(sched.model.template.ops)))
        later = [run.submit(f"b{i}", Priority.HIGH, 300, max_tokens=8, slo_s=5.0)
                 for i in range(6)]
        await run.run_out()
    assert any(op.device == "cpu:1" for op in run.ops)
    assert all(o.finish is FinishReason.LENGTH and len(o.tokens) == 8 for o in first + later)
    assert len(sched.actuation.actuation_s) == len(sched.model.template.ops)


async def test_remove_waits_until_no_request_needs_the_replica() -> None:
    async with opscale_run() as run:
        sched, n = run.sched, len(run.sched.model.template.ops)
        for i in range(n):
            await sched.actuation.add(i, "cpu:1")
        outs = [run.submit(f"r{i}", Priority.HIGH, 400, max_tokens=30, slo_s=5.0)
                for i in range(6)]
        await run.run_until(0.01)
        on_1 = [s for s in sched.states.values() if s.placement and "cpu:1" in s.placement]
        assert on_1, "some request runs on the second device"
        group = next(i for i in range(n) if on_1[0].placement[i] == "cpu:1")  # type: ignore[index]
        sched.actuation.remove(group, "cpu:1")
        assert sched.replicas.state(group, "cpu:1") is ReplicaState.DRAINING
        assert "cpu:1" not in sched.replicas.holders_of(group)
        weights = sched.ledgers["cpu:1"].used("weights")
        await run.run_out()
        assert sched.replicas.state(group, "cpu:1") is None  # freed once they finished
        assert sched.ledgers["cpu:1"].used("weights") == \
            weights - sched.model.template.ops[group].weight_bytes
    assert all(o.finish is FinishReason.LENGTH and len(o.tokens) == 30 for o in outs)
