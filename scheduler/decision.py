"""What a policy decides in one round, as data. The scheduler applies it; nothing else does.

Order of application: preemptions, then admissions, then plans (each plan's
ops are the ones the policy built and scored), then failures.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.plan import Plan
from scheduler.requestview import Placement


@dataclass(frozen=True, slots=True)
class Admission:
    """Reserve `kv_tokens` of KV for `rid` on every device of `placement`; it leaves waiting."""

    rid: str
    placement: Placement
    kv_tokens: int


@dataclass(frozen=True, slots=True)
class Preemption:
    """Free `rid`'s KV and put it back at the head of its class's waiting queue."""

    rid: str
    reason: str  # e.g. "kv for <rid>"


@dataclass(frozen=True, slots=True)
class Failure:
    """Deciding for these requests raised: they end with a server error; the round goes on."""

    rids: tuple[str, ...]
    error: str  # one line, for the client
    traceback: str  # for the log


@dataclass(slots=True)
class RoundDecision:
    admissions: list[Admission] = field(default_factory=list)
    preemptions: list[Preemption] = field(default_factory=list)
    plans: list[Plan] = field(default_factory=list)  # built (op ids assigned), not issued
    failures: list[Failure] = field(default_factory=list)
    # NOTE: True when the policy held work back only because of the predicted state of
    # the devices (harm to a deadline, OOM); completions of single ops may change that.
    retry_on_progress: bool = False

    @property
    def empty(self) -> bool:
        return not (self.admissions or self.preemptions or self.plans or self.failures)
