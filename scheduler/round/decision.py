"""What a policy decides in one round, as data. The scheduler applies it; nothing else does.

Order of application: preemptions and migrations (which free blocks), then
admissions and growths (which take them), then plans (each plan's ops are the
ones the policy built and scored), then blocked marks and failures.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.round.plan import Plan
from scheduler.round.requestview import Placement


@dataclass(frozen=True, slots=True)
class Admission:
    """Reserve `kv_tokens` of KV for `rid` on every device of `placement`; it leaves waiting.
    Its first `num_cached` tokens are cached blocks on its one device (prefix cache hit)."""

    rid: str
    placement: Placement
    kv_tokens: int
    num_cached: int = 0


@dataclass(frozen=True, slots=True)
class Preemption:
    """Take `rid`'s KV off its devices and put it back at the head of its class's waiting
    queue: to host memory (`swap`) or dropped, to recompute."""

    rid: str
    reason: str  # e.g. "kv for <rid>"
    swap: bool = False


@dataclass(frozen=True, slots=True)
class Growth:
    """Grow `rid`'s KV on every device of its placement to hold `num_tokens` tokens."""

    rid: str
    num_tokens: int


@dataclass(frozen=True, slots=True)
class Migration:
    """Gather `rid`'s KV onto `target`; its placement becomes that device alone."""

    rid: str
    target: str


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
    migrations: list[Migration] = field(default_factory=list)
    growths: list[Growth] = field(default_factory=list)
    plans: list[Plan] = field(default_factory=list)  # built (op ids assigned), not issued
    blocked: list[str] = field(default_factory=list)  # requests whose step waits for KV
    failures: list[Failure] = field(default_factory=list)
    # NOTE: True when the policy held work back only because of the predicted state of
    # the devices (harm to a deadline, OOM); completions of single ops may change that.
    retry_on_progress: bool = False

    @property
    def empty(self) -> bool:
        return not (self.admissions or self.preemptions or self.migrations or self.growths
                    or self.plans or self.blocked or self.failures)
