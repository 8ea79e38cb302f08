"""A traced request's plans, kept as runs for its trace span (`scheduler.api.RequestTrace`).

Only requests that ask for it (`Request.trace`) keep a journal: an untraced request pays
nothing. A traced one pays a comparison and a few additions per plan: its decode steps on
one placement fold into one `PlanRun`, so a journal stays a few entries long however many
tokens the request generates.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.api import PlanRun, RequestTrace
from scheduler.round.plan import Plan


@dataclass(slots=True)
class _OpenRun:
    kind: str
    devices: tuple[str, ...]
    start: float
    end: float | None = None  # None while a plan of it is in flight
    num_plans: int = 0
    num_tokens: int = 0
    max_batch_size: int = 0


@dataclass(slots=True)
class PlanJournal:
    """One request's plan runs: `issued` when a plan of it goes out, `done` when it is over."""

    runs: list[_OpenRun] = field(default_factory=list)

    def issued(self, kind: str, devices: tuple[str, ...], now: float, num_tokens: int,
               batch_size: int) -> None:
        last = self.runs[-1] if self.runs else None
        if last is None or last.kind != kind or last.devices != devices:
            last = _OpenRun(kind, devices, now)
            self.runs.append(last)
        last.end = None
        last.num_plans += 1
        last.num_tokens += num_tokens
        last.max_batch_size = max(last.max_batch_size, batch_size)

    def issued_plan(self, plan: Plan, rid: str, prompt_len: int, now: float) -> None:
        """`plan` went out with request `rid` in it: a prefill while it feeds prompt tokens
        (or recomputes, after a preemption), else a decode step."""
        feeds = [f for chunk in plan.chunks for f in chunk if f.rid == rid]
        prefill = any(f.past < prompt_len or f.num_tokens - f.num_draft > 1 for f in feeds)
        self.issued("prefill" if prefill else "decode", tuple(dict.fromkeys(plan.placement)),
                    now, sum(f.num_tokens for f in feeds), len(plan.rids))

    def done(self, now: float) -> None:
        if self.runs and self.runs[-1].end is None:
            self.runs[-1].end = now

    def trace(self, scheduled_time: float | None, num_preemptions: int,
              now: float) -> RequestTrace:
        """The journal so far; a run still in flight ends at `now`."""
        runs = tuple(PlanRun(r.kind, r.devices, r.start, now if r.end is None else r.end,
                             r.num_plans, r.num_tokens, r.max_batch_size) for r in self.runs)
        return RequestTrace(scheduled_time, num_preemptions, runs)
