"""A traced request's plan journal: runs fold decode steps, and the last event carries them."""

from __future__ import annotations

import models
from executors.types import Priority
from models.sampling_params import SamplingParams
from scheduler.api import PlanRun, Request, TokenEvent
from scheduler.core.journal import PlanJournal
from tests.scheduler.conftest import make_scheduler

GREEDY = SamplingParams(temperature=0, max_tokens=10)


def test_decode_steps_on_one_placement_fold_into_one_run() -> None:
    journal = PlanJournal()
    journal.issued("prefill", ("cpu:0", "cpu:1"), 1.0, 480, 1)
    journal.done(2.0)
    for step in range(5):
        journal.issued("decode", ("cpu:0",), 2.0 + step, 1, 3 - step % 2)
        journal.done(2.5 + step)
    journal.issued("decode", ("cpu:1",), 8.0, 1, 1)  # migrated: a new run
    trace = journal.trace(scheduled_time=1.0, num_preemptions=0, now=9.0)
    assert trace.runs == (PlanRun("prefill", ("cpu:0", "cpu:1"), 1.0, 2.0, 1, 480, 1),
                          PlanRun("decode", ("cpu:0",), 2.0, 6.5, 5, 5, 3),
                          PlanRun("decode", ("cpu:1",), 8.0, 9.0, 1, 1, 1))  # open: ends now


async def _events(sched, request: Request) -> list[TokenEvent]:  # type: ignore[no-untyped-def]
    return [event async for event in sched.submit(request)]


async def test_a_traced_request_ends_with_its_prefill_and_decode_runs(
        tiny_model: models.Model) -> None:
    sched = make_scheduler(tiny_model, "slice")
    await sched.start()
    prompt = [(5 * j) % 1000 + 3 for j in range(480)]
    try:
        traced = await _events(sched, Request("t", "a", Priority.HIGH, prompt, GREEDY,
                                              trace=True))
        plain = await _events(sched, Request("p", "a", Priority.HIGH, prompt[:8], GREEDY))
    finally:
        await sched.stop()
    assert all(e.trace is None for e in traced[:-1] + plain)
    trace = traced[-1].trace
    assert trace is not None and trace.num_preemptions == 0
    prefill, *decodes = trace.runs
    assert prefill.kind == "prefill" and prefill.num_tokens == len(prompt)
    assert set(prefill.devices) == {"cpu:0", "cpu:1"}  # pipelined, as the timeline shows
    assert trace.scheduled_time == prefill.start <= traced[0].time <= prefill.end  # then done
    assert {r.kind for r in decodes} == {"decode"}
    # the prefill samples the first token; each later token is one decode plan
    assert sum(r.num_plans for r in decodes) == sum(r.num_tokens for r in decodes) \
        == GREEDY.max_tokens - 1
    assert all(a.end <= b.start for a, b in zip(trace.runs, trace.runs[1:], strict=False))
