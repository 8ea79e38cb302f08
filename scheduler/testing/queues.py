"""Waiting queues with a fixed capacity per class: the fake scheduler's admission."""

from __future__ import annotations

from collections import deque
from typing import Generic, Protocol, TypeVar

from executors.types import Priority
from scheduler.api import Overloaded


class Queued(Protocol):
    @property
    def request_id(self) -> str: ...
    @property
    def priority(self) -> Priority: ...


Q = TypeVar("Q", bound=Queued)


class BoundedQueues(Generic[Q]):
    """Waiting requests, one FIFO per priority class, each with a capacity."""

    def __init__(self, capacity: dict[Priority, int]) -> None:
        self._capacity = dict(capacity)
        self._queues: dict[Priority, deque[Q]] = {p: deque() for p in Priority}

    def can_push(self, priority: Priority) -> bool:
        return len(self._queues[priority]) < self._capacity.get(priority, 0)

    def push(self, request: Q) -> None:
        if not self.can_push(request.priority):
            raise Overloaded(f"too many waiting {request.priority.label}-priority requests")
        self._queues[request.priority].append(request)

    def remove(self, request_id: str) -> Q | None:
        for q in self._queues.values():
            for r in q:
                if r.request_id == request_id:
                    q.remove(r)
                    return r
        return None

    def queue(self, priority: Priority) -> deque[Q]:
        return self._queues[priority]

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def count(self, priority: Priority) -> int:
        return len(self._queues[priority])
