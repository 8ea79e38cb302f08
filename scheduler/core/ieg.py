"""Requests and their Inference Execution Graphs (IEG).

The gateway builds a `Request` after tokenizing and hands it to
`Scheduler.submit`, which yields `TokenEvent`s. A request's IEG is the chain
Tokenize -> Prefill (one node per chunk) -> Decode* (one node appended per
generated token) -> Output; each node walks the `NodeState` machine.
"""

from __future__ import annotations

import enum
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from executors.types import Priority
from models.sampling_params import SamplingParams


class NodeState(enum.Enum):
    """State of one IEG node (and of the request, as the state of its frontier)."""

    INIT = "init"
    READY = "ready"
    SCHEDULED = "scheduled"
    RUNNING = "running"
    BLOCKED = "blocked"
    PREEMPTED = "preempted"
    COMPLETED = "completed"
    FAILED = "failed"
    ABORTED = "aborted"

    @property
    def is_finished(self) -> bool:
        return self in _FINISHED


_FINISHED = {NodeState.COMPLETED, NodeState.FAILED, NodeState.ABORTED}

_TRANSITIONS: dict[NodeState, set[NodeState]] = {
    NodeState.INIT: {NodeState.READY, NodeState.ABORTED, NodeState.FAILED},
    NodeState.READY: {
        NodeState.SCHEDULED, NodeState.BLOCKED, NodeState.PREEMPTED, NodeState.ABORTED,
        NodeState.FAILED,
    },
    NodeState.SCHEDULED: {
        NodeState.RUNNING, NodeState.PREEMPTED, NodeState.ABORTED, NodeState.FAILED
    },
    NodeState.RUNNING: {
        NodeState.BLOCKED, NodeState.COMPLETED, NodeState.PREEMPTED,
        NodeState.ABORTED, NodeState.FAILED,
    },
    NodeState.BLOCKED: {NodeState.READY, NodeState.RUNNING, NodeState.ABORTED, NodeState.FAILED},
    NodeState.PREEMPTED: {NodeState.READY, NodeState.ABORTED, NodeState.FAILED},
    NodeState.COMPLETED: set(),
    NodeState.FAILED: set(),
    NodeState.ABORTED: set(),
}


class NodeKind(enum.Enum):
    TOKENIZE = "tokenize"
    PREFILL = "prefill"
    DECODE = "decode"
    OUTPUT = "output"


@dataclass(slots=True)
class IEGNode:
    """One node of a request's IEG: its spec (tokens, KV bytes, deadline) and state."""

    kind: NodeKind
    index: int  # chunk index for PREFILL, token index for DECODE, else 0
    num_tokens: int  # tokens this node feeds through the model
    num_context_tokens: int  # tokens already in KV before this node
    deadline: float | None = None  # monotonic seconds; TTFT deadline on the last prefill
    state: NodeState = NodeState.INIT

    def advance(self, new: NodeState) -> None:
        if new not in _TRANSITIONS[self.state]:
            raise ValueError(f"IEG node {self.kind.value}[{self.index}]: {self.state.value} -> "
                             f"{new.value} is not a valid transition")
        self.state = new


class FinishReason(enum.Enum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One generated token, or the end of the stream.

    The last event of a request has `finish_reason` set; an event that ends a
    request without a new token (abort, error) has `token_id` None.
    """

    token_id: int | None
    index: int  # 0-based index among generated tokens
    time: float  # time.monotonic() when the token was sampled
    finish_reason: FinishReason | None = None
    error: str | None = None  # set with FinishReason.ERROR
    num_cached_tokens: int = 0  # prompt tokens its first prefill found in the prefix cache


class SubmitError(Exception):
    """Base of the errors `Scheduler.submit` raises before any token is produced."""


class RequestTooLarge(SubmitError):
    """The request can never fit (context length or KV capacity). Maps to HTTP 400."""


class Overloaded(SubmitError):
    """The request was shed: its class's queue or the server is full, or it was evicted for
    a higher class (`reason`, see scheduler/core/admission.py). Maps to HTTP 503 with
    Retry-After."""

    def __init__(self, message: str, retry_after_s: float = 1.0,
                 reason: str = "server_full") -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.reason = reason


@dataclass(slots=True)
class Request:
    """What the gateway submits: one tokenized generation request."""

    request_id: str
    tenant: str
    priority: Priority
    prompt_token_ids: list[int]
    sampling: SamplingParams
    ttft_slo_s: float | None = None  # the tenant's TTFT SLO; None = best effort
    arrival_time: float = field(default_factory=time.monotonic)  # HTTP receipt, monotonic s
    deadline_s: float | None = None  # total wall-clock budget from arrival; None = none
    # NOTE: keys its KV blocks in the prefix cache: requests hit each other's blocks only
    # with equal salts ("" is shared; a tenant that does not share uses its name)
    cache_salt: str = ""

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError("prompt_token_ids must not be empty")

    @property
    def max_tokens(self) -> int:
        return self.sampling.max_tokens

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def ttft_deadline(self) -> float | None:
        """Monotonic time by which the first token is due, or None."""
        if self.ttft_slo_s is None:
            return None
        return self.arrival_time + self.ttft_slo_s

    def build_ieg(self, chunk_tokens: int) -> list[IEGNode]:
        """Tokenize -> Prefill chunks of at most `chunk_tokens` -> Output.

        Decode nodes are appended one per generated token while the request runs.
        """
        nodes = [IEGNode(NodeKind.TOKENIZE, 0, 0, 0, state=NodeState.COMPLETED)]
        n = len(self.prompt_token_ids)
        for i, start in enumerate(range(0, n, chunk_tokens)):
            size = min(chunk_tokens, n - start)
            last = start + size >= n
            nodes.append(IEGNode(NodeKind.PREFILL, i, size, start,
                                 deadline=self.ttft_deadline if last else None))
        nodes.append(IEGNode(NodeKind.OUTPUT, 0, 0, n))
        return nodes


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
