"""Admission by work: queue bounds, the shedding order, Retry-After, ageing."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from executors.types import Priority
from scheduler.api import FinishReason, Overloaded
from scheduler.config import QueueLimits, SchedulerConfig
from scheduler.core.admission import CLASS_FULL, EVICTED, SERVER_FULL, DrainRate, WaitingQueues
from tests.scheduler.cluster import ClusterRun

H, N, L = Priority.HIGH, Priority.NORMAL, Priority.LOW


@dataclass
class Item:
    request_id: str
    priority: Priority
    tenant: str = "t"
    num_prompt_tokens: int = 10


def queues(requests: int = 10, tokens: int = 1000, total_requests: int | None = None,
           total_tokens: int | None = None) -> WaitingQueues[Item]:
    return WaitingQueues(QueueLimits(dict.fromkeys(Priority, requests),
                                     dict.fromkeys(Priority, tokens), total_requests,
                                     total_tokens))


def fill(q: WaitingQueues[Item], *items: Item) -> None:
    for it in items:
        assert q.push(it, q.verdict(it)) == []


def test_a_low_arrival_is_rejected_when_the_server_is_full() -> None:
    q = queues(total_requests=3)
    fill(q, Item("l1", L), Item("l2", L), Item("h1", H))
    v = q.verdict(Item("l3", L))
    assert v.reason == SERVER_FULL and not v.victims
    with pytest.raises(Overloaded) as e:
        q.push(Item("l3", L), v)
    assert e.value.reason == SERVER_FULL
    assert len(q) == 3


def test_a_high_arrival_evicts_the_newest_of_the_lowest_class() -> None:
    q = queues(total_requests=4)
    fill(q, Item("n1", N), Item("l1", L), Item("l2", L), Item("n2", N))
    v = q.verdict(Item("h1", H))
    assert v.accepted and v.victims == ("l2",)  # newest low, not a normal one
    evicted = q.push(Item("h1", H), v)
    assert [e.request_id for e in evicted] == ["l2"]
    assert [r.request_id for r in q] == ["h1", "n1", "n2", "l1"]
    # lows gone, a normal arrival may not evict a normal one: it is rejected
    fill_to = q.verdict(Item("h2", H))
    assert fill_to.victims == ("l1",)
    q.push(Item("h2", H), fill_to)
    assert q.verdict(Item("n3", N)).reason == SERVER_FULL


def test_prompt_tokens_bound_a_class_and_the_total() -> None:
    q = queues(tokens=100, total_tokens=150)
    fill(q, Item("l1", L, num_prompt_tokens=60))
    assert q.verdict(Item("l2", L, num_prompt_tokens=50)).reason == CLASS_FULL
    assert q.verdict(Item("l2", L, num_prompt_tokens=40)).accepted
    fill(q, Item("n1", N, num_prompt_tokens=80))
    v = q.verdict(Item("h1", H, num_prompt_tokens=50))
    assert v.victims == ("l1",)  # 60 + 80 + 50 > 150: the low one goes
    assert q.tokens(L) == 60 and q.tokens(N) == 80


def test_within_a_full_class_the_heaviest_tenant_gives_way() -> None:
    q = queues(requests=4)
    fill(q, *(Item(f"a{i}", L, "flood") for i in range(4)))
    # the flooding tenant's own arrival is the one shed
    assert q.verdict(Item("a4", L, "flood")).reason == CLASS_FULL
    # another tenant's arrival evicts the flooder's newest request
    v = q.verdict(Item("b0", L, "steady"))
    assert v.accepted and v.victims == ("a3",)
    # its counter counts: a tenant that was served far more is the heavier one
    q2 = queues(requests=2)
    fill(q2, Item("a0", L, "a"), Item("b0", L, "b"))
    served = {"a": 0.0, "b": 1000.0}
    assert q2.verdict(Item("a1", L, "a"), served.__getitem__).victims == ("b0",)


def test_requeue_and_remove_keep_token_counts() -> None:
    q = queues()
    fill(q, Item("l1", L, num_prompt_tokens=7))
    r = q.remove("l1")
    assert r is not None and q.tokens(L) == 0 and len(q) == 0
    q.requeue(r)
    assert q.tokens(L) == 7 and q.count(L) == 1


def test_retry_after_follows_the_drain_rate() -> None:
    d = DrainRate(window_s=10)
    assert d.retry_after_s(0.0, 10_000) == 1.0  # nothing measured yet
    for t in range(10):
        d.record(float(t), 100)  # 100 tokens/s
    assert d.retry_after_s(10.0, 500) == pytest.approx(5.0, rel=0.15)
    assert d.retry_after_s(10.0, 10**9) == 60.0  # clamped


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError):
        SchedulerConfig(queue_total_requests=-1)
    with pytest.raises(ValueError):
        SchedulerConfig(max_low_wait_s=0)


def _cfg(**kw: object) -> SchedulerConfig:
    return SchedulerConfig(policy="slice", max_model_len=1024, max_batch_tokens=512,
                           **kw)  # type: ignore[arg-type]


async def test_an_evicted_request_gets_overloaded_with_retry_after() -> None:
    cfg = _cfg(queue_total_requests=3)
    async with ClusterRun("slice", cfg=cfg) as run:
        # a long low prefill occupies the devices; the rest wait
        lows = [run.submit(f"l{i}", L, 200, max_tokens=8, tenant="batch") for i in range(3)]
        high = run.submit("h", H, 32, max_tokens=2, slo_s=1.0, tenant="chat")
        with pytest.raises(Overloaded) as e:
            run.submit("l9", L, 50, tenant="batch")
        assert e.value.reason == SERVER_FULL and e.value.retry_after_s >= 1
        await run.run_out()
    assert high.finish is FinishReason.LENGTH
    shed = [o for o in lows if o.shed is not None]
    assert len(shed) == 1 and shed[0] is lows[-1]  # the newest low
    assert shed[0].shed is not None and shed[0].shed.reason == EVICTED
    assert all(o.finish is FinishReason.LENGTH for o in lows[:-1])
    assert run.sched.kv.usage() == 0 and not run.sched.states


async def test_a_low_request_is_aged_into_normal() -> None:
    cfg = _cfg(max_low_wait_s=0.5)
    async with ClusterRun("priority", cfg=cfg) as run:
        old = run.submit("old", L, 64, max_tokens=2, tenant="batch")
        run.cluster.run_until(1.0)
        new = run.submit("new", L, 64, max_tokens=2, tenant="batch")
        waiting = run.sched.requests.waiting  # no round ran yet: both wait
        assert [s.rid for s in waiting.queue(L)] == ["old", "new"]
        aged = run.sched.requests.age(run.cluster.now - cfg.max_low_wait_s)  # type: ignore[operator]
        assert [s.rid for s in aged] == ["old"]
        assert [s.rid for s in waiting.queue(N)] == ["old"]
        assert waiting.tokens(N) == 64 and waiting.tokens(L) == 64
        await run.run_out()
    assert old.finish is new.finish is FinishReason.LENGTH
