"""A request's Inference Execution Graph (IEG).

The gateway builds a `Request` (scheduler/api.py) after tokenizing and hands it to
`Scheduler.submit`, which yields `TokenEvent`s. A request's IEG is the chain
Tokenize -> Prefill (one node per chunk) -> Decode* (one node appended per
generated token) -> Output; each node walks the `NodeState` machine.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from scheduler.api import Request


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


def build_ieg(req: Request, chunk_tokens: int) -> list[IEGNode]:
    """Tokenize -> Prefill chunks of at most `chunk_tokens` -> Output.

    Decode nodes are appended one per generated token while the request runs.
    """
    nodes = [IEGNode(NodeKind.TOKENIZE, 0, 0, 0, state=NodeState.COMPLETED)]
    n = len(req.prompt_token_ids)
    for i, start in enumerate(range(0, n, chunk_tokens)):
        size = min(chunk_tokens, n - start)
        last = start + size >= n
        nodes.append(IEGNode(NodeKind.PREFILL, i, size, start,
                             deadline=req.ttft_deadline if last else None))
    nodes.append(IEGNode(NodeKind.OUTPUT, 0, 0, n))
    return nodes
