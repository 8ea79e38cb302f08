"""Admission by work: waiting queues bounded by requests and prompt tokens, and who is shed.

Each class has its own waiting queue, bounded by a number of requests and a number of
prompt tokens (`QueueLimits.max_requests`, `max_tokens`); all queues together are bounded
by `total_requests` and `total_tokens`. `WaitingQueues.verdict` (pure) says what an arrival
costs; `WaitingQueues.push` commits it:

- its own class is full: within the class the heaviest tenant (virtual tokens served plus
  prompt tokens queued) gives up its newest request; when the arrival's tenant is the
  heaviest, the arrival is rejected (`class_full`). One tenant flooding a class thus fills
  it with its own requests only until another tenant of that class arrives.
- the server is full: the newest request of the lowest class below the arrival's is
  evicted (`evicted`), until the arrival fits; with no lower class waiting, the arrival is
  rejected (`server_full`). A low arrival is rejected; a high arrival may evict low ones.

`DrainRate` measures how fast queued prompt tokens are served, so that a rejection can say
when to retry (`Retry-After`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from executors.types import Priority
from scheduler.api import Overloaded
from scheduler.config import QueueLimits

CLASS_FULL, SERVER_FULL, EVICTED = "class_full", "server_full", "evicted"
RETRY_MIN_S, RETRY_MAX_S = 1.0, 60.0  # Retry-After is clamped to this range


@dataclass(frozen=True, slots=True)
class Verdict:
    """What admitting an arrival takes: nothing, evicting `victims` first, or a rejection."""

    reason: str | None = None  # CLASS_FULL or SERVER_FULL: the arrival is rejected
    victims: tuple[str, ...] = ()  # request ids to evict (shed) before the arrival is queued

    @property
    def accepted(self) -> bool:
        return self.reason is None


class Queued(Protocol):
    @property
    def request_id(self) -> str: ...
    @property
    def priority(self) -> Priority: ...
    @property
    def tenant(self) -> str: ...
    @property
    def num_prompt_tokens(self) -> int: ...


Q = TypeVar("Q", bound=Queued)
Weight = Callable[[str], float]  # tenant -> tokens of service it already had (its VTC counter)


def _no_weight(tenant: str) -> float:
    return 0.0


class WaitingQueues(Generic[Q]):
    """One FIFO per class with its prompt tokens counted; bounds and shedding in `verdict`."""

    def __init__(self, limits: QueueLimits) -> None:
        self.limits = limits
        self._queues: dict[Priority, deque[Q]] = {p: deque() for p in Priority}
        self._tokens: dict[Priority, int] = dict.fromkeys(Priority, 0)

    # -- the pure half -------------------------------------------------------------------
    def verdict(self, r: Q, weight: Weight = _no_weight) -> Verdict:
        """Whether `r` may queue now and whom it evicts (see the module docstring)."""
        gone: set[str] = set()
        victims: list[str] = []
        while not self._class_fits(r, gone):
            v = self._heaviest_newest(r, gone, weight)
            if v is None:
                return Verdict(CLASS_FULL)
            gone.add(v.request_id)
            victims.append(v.request_id)
        while not self._total_fits(r, gone):
            v = self._newest_lower(r.priority, gone)
            if v is None:
                return Verdict(SERVER_FULL)
            gone.add(v.request_id)
            victims.append(v.request_id)
        return Verdict(None, tuple(victims))

    def _left(self, p: Priority, gone: set[str]) -> tuple[int, int]:
        out = [q for q in self._queues[p] if q.request_id in gone]
        return (len(self._queues[p]) - len(out),
                self._tokens[p] - sum(q.num_prompt_tokens for q in out))

    def _class_fits(self, r: Q, gone: set[str]) -> bool:
        n, tokens = self._left(r.priority, gone)
        return (n + 1 <= self.limits.max_requests.get(r.priority, 0)
                and tokens + r.num_prompt_tokens <= self.limits.max_tokens.get(r.priority, 0))

    def _total_fits(self, r: Q, gone: set[str]) -> bool:
        n = tokens = 0
        for p in Priority:
            pn, pt = self._left(p, gone)
            n, tokens = n + pn, tokens + pt
        lim = self.limits
        return ((lim.total_requests is None or n + 1 <= lim.total_requests)
                and (lim.total_tokens is None or tokens + r.num_prompt_tokens <= lim.total_tokens))

    def _heaviest_newest(self, r: Q, gone: set[str], weight: Weight) -> Q | None:
        """The newest queued request of the heaviest tenant of `r`'s class, unless that tenant
        is `r`'s own (then None: `r` is the one to shed)."""
        load: dict[str, float] = {r.tenant: weight(r.tenant) + r.num_prompt_tokens}
        newest: dict[str, Q] = {}
        for q in self._queues[r.priority]:
            if q.request_id in gone:
                continue
            load.setdefault(q.tenant, weight(q.tenant))
            load[q.tenant] += q.num_prompt_tokens
            newest[q.tenant] = q
        # NOTE: ties go to the arrival's tenant: an arrival never evicts an equal tenant
        heaviest = max(load, key=lambda t: (load[t], t == r.tenant))
        return None if heaviest == r.tenant else newest[heaviest]

    def _newest_lower(self, priority: Priority, gone: set[str]) -> Q | None:
        for p in sorted(Priority, reverse=True):
            if p <= priority:
                return None
            for q in reversed(self._queues[p]):
                if q.request_id not in gone:
                    return q
        return None

    # -- commits -------------------------------------------------------------------------
    def push(self, r: Q, verdict: Verdict) -> list[Q]:
        """Queue `r` after evicting the verdict's victims (returned, for their owner to end);
        raises Overloaded when the verdict rejects it."""
        if not verdict.accepted:
            raise Overloaded(f"too much {r.priority.label}-priority work is waiting",
                             reason=verdict.reason or SERVER_FULL)
        evicted = [q for rid in verdict.victims if (q := self.remove(rid)) is not None]
        self._queues[r.priority].append(r)
        self._tokens[r.priority] += r.num_prompt_tokens
        return evicted

    def requeue(self, r: Q, front: bool = True) -> None:
        """Put back a request that was queued before (preempted, or aged into another class);
        bounds do not apply: it was admitted once."""
        q = self._queues[r.priority]
        q.appendleft(r) if front else q.append(r)
        self._tokens[r.priority] += r.num_prompt_tokens

    def remove(self, request_id: str) -> Q | None:
        for p, q in self._queues.items():
            for r in q:
                if r.request_id == request_id:
                    q.remove(r)
                    self._tokens[p] -= r.num_prompt_tokens
                    return r
        return None

    # -- reading -------------------------------------------------------------------------
    def queue(self, priority: Priority) -> deque[Q]:
        return self._queues[priority]

    def tokens(self, priority: Priority) -> int:
        return self._tokens[priority]

    def count(self, priority: Priority) -> int:
        return len(self._queues[priority])

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def __iter__(self) -> Iterator[Q]:
        for p in Priority:
            yield from self._queues[p]


@dataclass(slots=True)
class DrainRate:
    """Prompt tokens served per second over the last `window_s` (what drains the queues)."""

    window_s: float = 30.0
    _served: deque[tuple[float, int]] = field(default_factory=deque)  # (monotonic s, tokens)

    def record(self, now: float, tokens: int) -> None:
        self._served.append((now, tokens))
        while self._served and self._served[0][0] < now - self.window_s:
            self._served.popleft()

    def tokens_per_s(self, now: float) -> float | None:
        """None until something was served in the window."""
        recent = [(t, n) for t, n in self._served if t >= now - self.window_s]
        if not recent:
            return None
        span = max(now - recent[0][0], 1.0)
        return sum(n for _, n in recent) / span

    def retry_after_s(self, now: float, tokens_ahead: int) -> float:
        """Predicted seconds until `tokens_ahead` queued tokens are served, clamped."""
        rate = self.tokens_per_s(now)
        if rate is None or rate <= 0:
            return RETRY_MIN_S
        return min(RETRY_MAX_S, max(RETRY_MIN_S, tokens_ahead / rate))
