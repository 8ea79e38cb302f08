"""A running request's state inside the scheduler: its IEG, KV progress and output stream."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from executors.types import Priority
from scheduler.ieg import FinishReason, IEGNode, NodeKind, NodeState, Request, TokenEvent

Placement = tuple[str, ...]  # device name per operator of the chain


@dataclass(eq=False)
class RequestState:
    """Scheduler-side view of one request."""

    req: Request
    nodes: list[IEGNode]
    events: asyncio.Queue[TokenEvent] = field(default_factory=asyncio.Queue)
    output_ids: list[int] = field(default_factory=list)
    num_computed: int = 0  # tokens whose KV is written
    placement: Placement | None = None  # fixed by the first prefill (KV affinity)
    tables: dict[str, list[int]] = field(default_factory=dict)  # device -> KV block table
    in_flight: bool = False  # part of an issued batch that has not completed
    finished: bool = False
    abort_reason: str | None = None  # set while in flight; applied when the batch completes
    scheduled_time: float | None = None  # first time any of its ops was issued
    first_token_time: float | None = None
    last_token_time: float | None = None
    num_preemptions: int = 0

    @property
    def rid(self) -> str:
        return self.req.request_id

    @property
    def priority(self) -> Priority:
        return self.req.priority

    @property
    def prompt_len(self) -> int:
        return len(self.req.prompt_token_ids)

    @property
    def request_id(self) -> str:
        return self.req.request_id

    @property
    def num_tokens(self) -> int:
        """Prompt + generated tokens (a preempted request recomputes all of them)."""
        return self.prompt_len + len(self.output_ids)

    @property
    def is_prefilling(self) -> bool:
        """More than one token still to feed: a prompt (or a recompute after preemption)."""
        return self.num_tokens - self.num_computed > 1



    def next_chunk(self, max_tokens: int) -> list[int]:
        """Tokens to feed next: a chunk of what is not in KV yet (the last token when decoding)."""
        start = self.num_computed
        if start < self.prompt_len:
            return self.req.prompt_token_ids[start:start + max_tokens] + self.output_ids[
                :max(0, start + max_tokens - self.prompt_len)]
        return self.output_ids[start - self.prompt_len:start - self.prompt_len + max_tokens]

    def emit(self, event: TokenEvent) -> None:
        self.events.put_nowait(event)

    def finish(self, reason: FinishReason, error: str | None = None, emit: bool = True) -> None:
        """End the request and mark the IEG's open nodes; `emit` closes the stream too."""
        if self.finished and emit:
            return
        self.finished = True
        if emit:
            self.emit(TokenEvent(None, len(self.output_ids), time.monotonic(), reason, error))
        end = {FinishReason.ERROR: NodeState.FAILED, FinishReason.ABORT: NodeState.ABORTED}
        final = end.get(reason)
        for n in self.nodes:
            if n.state.is_finished:
                continue
            if final is None:
                walk(n, NodeState.COMPLETED)
            else:
                n.advance(final)

    def add_decode_node(self) -> IEGNode:
        node = IEGNode(NodeKind.DECODE, len(self.output_ids), 1, self.num_computed,
                       state=NodeState.READY)
        self.nodes.insert(len(self.nodes) - 1, node)  # before Output
        return node


_PATH = (NodeState.INIT, NodeState.READY, NodeState.SCHEDULED, NodeState.RUNNING,
         NodeState.COMPLETED)


def walk(node: IEGNode, target: NodeState) -> None:
    """Advance `node` along INIT -> READY -> SCHEDULED -> RUNNING -> COMPLETED up to `target`."""
    if node.state is NodeState.PREEMPTED:
        node.advance(NodeState.READY)
    if node.state is NodeState.BLOCKED:
        node.advance(NodeState.RUNNING)
    for state in _PATH[_PATH.index(node.state) + 1:_PATH.index(target) + 1]:
        node.advance(state)
