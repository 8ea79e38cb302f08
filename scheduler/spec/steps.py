"""A verify step's outcome, the scheduler's side: the runs it emitted, the acceptance booked.

When a chunk's head op ends, the scheduler (scheduler/scheduler.py) reads here
which drafted feeds emitted a run of tokens (`verify_runs`) and books how many
drafts each run accepted (`book_run`); it emits the run's tokens itself, one by
one, as any decoded token, and frees the rejected drafts' blocks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from models.logprobs import runs_of
from scheduler.api import SchedulerStats, SpecDecodeCounts
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


def book_run(spec: SpecState | None, counters: SpecCounters, run: list[int],
             model: str | None = None) -> None:
    """Book a verify step's acceptance (`run`: its accepted drafts, then one more token),
    under the request's `model` too; the request's drafts in flight are done."""
    drafts = spec.in_flight if spec is not None else []
    accepted = len(run) - 1
    counters.record(len(drafts), accepted, model)
    if spec is not None:
        spec.acceptance.observe(len(drafts), accepted)
        spec.in_flight = []


def with_counters(stats: SchedulerStats, c: SpecCounters,
                  models: Sequence[str] = ("",)) -> SchedulerStats:
    """`stats` with the speculation counters of each of `models` filled in (0 for a model
    that drafted nothing)."""
    zero = SpecCounters()
    return dataclasses.replace(stats, spec_decode={m: _counts(c.by_model.get(m, zero))
                                                   for m in models})


def _counts(c: SpecCounters) -> SpecDecodeCounts:
    return SpecDecodeCounts(c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens,
                            tuple(c.accepted_per_pos))
