"""A verify step's outcome, the scheduler's side: the runs it emitted, the acceptance booked.

When a chunk's head op ends, the scheduler (scheduler/scheduler.py) reads here
which drafted feeds emitted a run of tokens (`verify_runs`) and books how many
drafts each run accepted (`book_run`); it emits the run's tokens itself, one by
one, as any decoded token, and frees the rejected drafts' blocks.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from models.logprobs import runs_of
from scheduler.api import SchedulerStats
from scheduler.round.plan import Feed
from scheduler.spec.choice import SpecCounters
from scheduler.spec.state import SpecState


def verify_runs(chunk: list[Feed], output: Any) -> dict[str, list[int]]:
    """Request id -> tokens its verify step emitted, for the chunk's drafted feeds."""
    runs = runs_of(output)
    if runs is None:
        return {}
    sampled = [f for f in chunk if f.samples]
    return {f.rid: run for f, run in zip(sampled, runs, strict=True) if f.num_draft}


def book_run(spec: SpecState | None, counters: SpecCounters, run: list[int]) -> None:
    """Book a verify step's acceptance (`run`: its accepted drafts, then one more token);
    the request's drafts in flight are done."""
    drafts = spec.in_flight if spec is not None else []
    accepted = len(run) - 1
    counters.record(len(drafts), accepted)
    if spec is not None:
        spec.acceptance.observe(len(drafts), accepted)
        spec.in_flight = []


def with_counters(stats: SchedulerStats, c: SpecCounters) -> SchedulerStats:
    """`stats` with the speculation counters filled in."""
    return dataclasses.replace(stats, spec_num_drafts=c.num_drafts,
                               spec_num_draft_tokens=c.num_draft_tokens,
                               spec_num_accepted_tokens=c.num_accepted_tokens,
                               spec_accepted_per_pos=tuple(c.accepted_per_pos))
