"""Nothing dies silently: failing rounds, completion handlers, executors and the round task."""

from __future__ import annotations

import asyncio

import pytest

from executors.types import OpInstance, Priority
from scheduler.api import FinishReason, Overloaded
from scheduler.round.decision import RoundDecision
from scheduler.round.view import RoundView
from tests.scheduler.cluster import ClusterRun


def _break_schedule(run: ClusterRun, broken: list[bool]) -> None:
    real = run.sched.policy.schedule

    def schedule(view: RoundView) -> RoundDecision:
        if broken[0]:
            raise RuntimeError("injected round failure")
        return real(view)
    run.sched.policy.schedule = schedule  # type: ignore[method-assign]


async def test_failing_rounds_end_waiting_requests_and_recover() -> None:
    broken = [True]
    async with ClusterRun("slice") as run:
        _break_schedule(run, broken)
        out = run.submit("a", Priority.HIGH, 40)
        for _ in range(200):
            await asyncio.sleep(0.01)
            if out.finish is not None:
                break
        assert out.finish is FinishReason.ERROR and "injected round failure" in (out.error or "")
        stats = run.sched.stats()
        assert not stats.healthy and "injected round failure" in (stats.health_detail or "")
        assert stats.errors_total >= run.sched.cfg.max_failed_rounds
        broken[0] = False
        ok = run.submit("b", Priority.HIGH, 40)
        await run.run_out()
        assert ok.finish is FinishReason.LENGTH and len(ok.tokens) == 4
        assert run.sched.stats().healthy
        assert run.sched.kv.used_blocks() == 0


async def test_a_decision_that_raises_fails_only_its_request() -> None:
    async with ClusterRun("slice") as run:
        real = run.sched.builder.op_time

        def op_time(device: str, name: str, shape: object) -> float:
            if getattr(shape, "num_tokens", 0) == 37:
                raise ValueError("injected estimator failure")
            return real(device, name, shape)  # type: ignore[arg-type]
        run.sched.builder.op_time = op_time  # type: ignore[method-assign]
        bad = run.submit("bad", Priority.HIGH, 37)
        good = run.submit("good", Priority.HIGH, 20)
        low = run.submit("low", Priority.LOW, 30)
        await run.run_out()
    assert bad.finish is FinishReason.ERROR and "injected estimator failure" in (bad.error or "")
    assert good.finish is FinishReason.LENGTH and low.finish is FinishReason.LENGTH
    assert run.sched.stats().errors_total == 1 and run.sched.stats().healthy
    assert run.sched.kv.used_blocks() == 0


async def test_a_completion_handler_that_raises_fails_its_plan_only() -> None:
    async with ClusterRun("fcfs") as run:
        real = run.sched.completions._chunk_done

        def chunk_done(plan, index, final) -> None:  # type: ignore[no-untyped-def]
            if "bad" in plan.rids:
                raise KeyError("injected handler failure")
            real(plan, index, final)
        run.sched.completions._chunk_done = chunk_done  # type: ignore[method-assign]
        bad = run.submit("bad", Priority.HIGH, 30)
        await run.run_out()
        good = run.submit("good", Priority.HIGH, 30)
        await run.run_out()
    assert bad.finish is FinishReason.ERROR and "injected handler failure" in (bad.error or "")
    assert good.finish is FinishReason.LENGTH
    assert run.sched.kv.used_blocks() == 0 and not run.sched.gmg.scheduled


async def test_an_op_that_keeps_failing_ends_its_requests_with_an_error() -> None:
    def fault(op: OpInstance) -> Exception | None:
        return RuntimeError("injected op fault") if op.name == "layers[1:2]" and \
            "bad" in op.request_ids else None
    async with ClusterRun("fcfs", fault=fault) as run:
        bad = run.submit("bad", Priority.LOW, 30)
        await run.run_out()
        good = run.submit("good", Priority.LOW, 30)
        await run.run_out()
    assert bad.finish is FinishReason.ERROR and "injected op fault" in (bad.error or "")
    assert good.finish is FinishReason.LENGTH and run.sched.kv.used_blocks() == 0


async def test_a_dead_round_task_is_unhealthy_and_refuses_new_requests() -> None:
    async with ClusterRun("slice") as run:
        waiting = run.submit("w", Priority.LOW, 30)
        assert run.sched._task is not None
        run.sched._task.cancel()  # not by stop(): the loop died
        await run.settle()
        assert waiting.finish is FinishReason.ERROR
        stats = run.sched.stats()
        assert not stats.healthy and "scheduler task ended" in (stats.health_detail or "")
        with pytest.raises(Overloaded):
            run.submit("late", Priority.HIGH, 10)


async def test_a_round_without_requests_decides_nothing_and_records_no_round_time() -> None:
    async with ClusterRun("slice") as run:
        out = run.submit("a", Priority.HIGH, 20)
        await run.run_out()
        assert out.finish is FinishReason.LENGTH
        before = run.sched.stats().round_seconds.count
        assert before > 0
        views: list[RoundView] = []
        real = run.sched.policy.schedule

        def schedule(view: RoundView) -> RoundDecision:
            views.append(view)
            return real(view)
        run.sched.policy.schedule = schedule  # type: ignore[method-assign]
        run.sched._wake.set()
        await run.settle()
        assert not views and run.sched.stats().round_seconds.count == before
        assert run.sched.stats().healthy
        again = run.submit("b", Priority.HIGH, 20)
        await run.run_out()
        assert again.finish is FinishReason.LENGTH and views
        assert run.sched.stats().round_seconds.count > before


async def test_the_learning_summary_is_a_supervised_task() -> None:
    async with ClusterRun("slice") as run:
        task = run.sched._learning_task
        assert task is not None and not task.done()  # started with the scheduler
        task.cancel()  # not by stop(): it died
        await run.settle()
        stats = run.sched.stats()
        assert not stats.healthy and "scheduler task ended" in (stats.health_detail or "")
    assert task.done()
