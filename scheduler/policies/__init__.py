"""Scheduling policies, selected by name: `fcfs`, `priority`, `static` (baselines) and `slice`.

A policy is a pure function of a round's `RoundView` returning a
`RoundDecision`: admissions, preemptions and plans (built, with their
predictions), which the scheduler applies. The baselines batch greedily on
the least-loaded device and keep at most one prefill plan in flight per
device, as a request-level scheduler (vLLM's) does; only `slice` looks
ahead by simulation.
"""

from __future__ import annotations

from typing import Protocol

from scheduler.policies.greedy import FcfsPolicy, PriorityPolicy, StaticPolicy
from scheduler.policies.slice import SlicePolicy
from scheduler.round.decision import RoundDecision
from scheduler.round.view import RoundView


class Policy(Protocol):
    name: str
    uses_simulation: bool  # whether its view needs a GMG snapshot

    def schedule(self, view: RoundView) -> RoundDecision: ...


POLICIES: dict[str, type] = {"fcfs": FcfsPolicy, "priority": PriorityPolicy,
                             "static": StaticPolicy, "slice": SlicePolicy}


def make_policy(name: str) -> Policy:
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}")
    policy: Policy = POLICIES[name]()
    return policy
