"""A running request's state inside the scheduler: its IEG, KV progress and output stream."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from executors.types import Priority
from scheduler.ieg import FinishReason, IEGNode, NodeKind, NodeState, Request, TokenEvent
from scheduler.requestview import Placement, RequestView


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
    error: str | None = None  # with abort_reason "error": what the client is told
    scheduled_time: float | None = None  # first time any of its ops was issued
    first_token_time: float | None = None
    last_token_time: float | None = None
    num_preemptions: int = 0
    _view: RequestView | None = field(default=None, repr=False)

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

    def view(self) -> RequestView:
        """This request as a policy sees it (cached until its progress or placement change)."""
        v = self._view
        if v is None or (v.num_computed, v.num_output, v.placement) != (
                self.num_computed, len(self.output_ids), self.placement):
            blocks = tuple((d, len(t)) for d, t in sorted(self.tables.items()))
            v = self._view = RequestView(
                self.rid, self.req.tenant, self.priority, self.req.arrival_time,
                self.req.ttft_slo_s, self.prompt_len, self.req.max_tokens, len(self.output_ids),
                self.num_computed, self.placement, blocks)
        return v

    def token_ids(self, start: int, count: int) -> list[int]:
        """Tokens [start, start + count) of prompt + output."""
        prompt = self.req.prompt_token_ids
        if start + count <= len(prompt):
            return prompt[start:start + count]
        return (prompt + self.output_ids)[start:start + count]

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
