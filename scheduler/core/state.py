"""A request's state inside the scheduler: its status, IEG, KV progress and output stream."""

from __future__ import annotations

import asyncio
import enum
import time
from dataclasses import dataclass, field

from executors.types import Priority
from models.logprobs import TokenLogprobs
from models.prefix_cache import BlockKey, block_keys
from scheduler.api import FinishReason, Request, RequestTrace, TokenEvent
from scheduler.core.ieg import IEGNode, NodeKind, NodeState
from scheduler.core.journal import PlanJournal
from scheduler.round.requestview import Placement, RequestView
from scheduler.spec.state import SpecState, eligible


class Status(enum.Enum):
    """Where a request is. WAITING/SWAPPED sit in a waiting queue; RUNNABLE/RUNNING hold KV.

    WAITING -> RUNNABLE (admitted) <-> RUNNING (a plan in flight) -> DONE; a RUNNABLE
    request may be preempted back to WAITING (its KV freed, to recompute) or SWAPPED (its
    KV in host memory, to copy back on resume).
    """

    WAITING = "waiting"
    SWAPPED = "swapped"
    RUNNABLE = "runnable"
    RUNNING = "running"
    DONE = "done"

    @property
    def is_queued(self) -> bool:
        return self in (Status.WAITING, Status.SWAPPED)

    @property
    def holds_kv(self) -> bool:
        return self in (Status.RUNNABLE, Status.RUNNING)


@dataclass(eq=False)
class RequestState:
    """Scheduler-side view of one request."""

    req: Request
    nodes: list[IEGNode]
    events: asyncio.Queue[TokenEvent] = field(default_factory=asyncio.Queue)
    status: Status = Status.WAITING
    output_ids: list[int] = field(default_factory=list)
    num_computed: int = 0  # tokens whose KV is written (held on devices, or swapped out)
    placement: Placement | None = None  # fixed by the first prefill (KV affinity)
    tables: dict[str, list[int]] = field(default_factory=dict)  # device -> KV block table
    ending: FinishReason | None = None  # set while RUNNING: end when the plan completes
    error: str | None = None  # with ending ERROR: what the client is told
    stream_closed: bool = False  # its last token event carried the finish reason
    scheduled_time: float | None = None  # first time any of its ops was issued
    first_token_time: float | None = None
    last_token_time: float | None = None
    num_preemptions: int = 0
    num_cached_tokens: int = 0  # prompt tokens its first admission found in the prefix cache
    num_registered: int = 0  # full blocks offered to the prefix cache since its admission
    # per prompt position, when it asks `sampling.prompt_logprobs` (filled as prefill runs)
    prompt_logprobs: list[TokenLogprobs | None] = field(default_factory=list)
    _keys: list[BlockKey] = field(default_factory=list, repr=False)  # of its full blocks
    shed: Exception | None = None  # set when evicted from its queue: its stream raises it
    journal: PlanJournal | None = None  # its plan runs, when the request asks `trace`
    spec: SpecState | None = None  # set when it speculates (`Request.speculative`)
    _view: RequestView | None = field(default=None, repr=False)
    _view_key: tuple = field(default=(), repr=False)

    def __post_init__(self) -> None:
        if self.req.trace:
            self.journal = PlanJournal()
        if self.req.speculative is not None:
            self.spec = SpecState(self.req.speculative)

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
    def num_prompt_tokens(self) -> int:
        return len(self.req.prompt_token_ids)

    @property
    def tenant(self) -> str:
        return self.req.tenant

    @property
    def request_id(self) -> str:
        return self.req.request_id

    @property
    def num_tokens(self) -> int:
        """Prompt + generated tokens (a preempted request recomputes all of them)."""
        return self.prompt_len + len(self.output_ids)

    @property
    def in_flight(self) -> bool:
        return self.status is Status.RUNNING

    @property
    def finished(self) -> bool:
        """Ended, or ending with its plan in flight: no more work is planned for it."""
        return self.status is Status.DONE or self.ending is not None

    def view(self, cached: tuple[tuple[str, int, int], ...] = (),
             shared: tuple[tuple[str, int], ...] = ()) -> RequestView:
        """This request as a policy sees it (cached until its progress, status or KV change);
        `cached` and `shared` as in `RequestView`."""
        key = (self.num_computed, len(self.output_ids), self.last_token_time, self.placement,
               self.status, self.priority, tuple(len(t) for t in self.tables.values()),
               cached, shared)
        if self._view is None or key != self._view_key:
            blocks = tuple((d, len(t)) for d, t in sorted(self.tables.items()))
            self._view_key = key
            self._view = RequestView(
                self.rid, self.req.tenant, self.priority, self.req.arrival_time,
                self.req.ttft_slo_s, self.prompt_len, self.req.max_tokens, len(self.output_ids),
                self.num_computed, self.placement, blocks, self.status is Status.SWAPPED,
                cached, shared, self.req.sampling.prompt_logprobs is not None, self.req.model,
                self.req.tpot_slo_s, self.last_token_time,
                self._proposal(), (0.0, 0.0) if self.spec is None else self.spec.acceptance.rates)
        return self._view

    def _proposal(self) -> tuple[int, ...]:
        """Prompt lookup's drafts for its next decode step (scheduler/spec/), if it may."""
        if self.spec is None or self.status is not Status.RUNNABLE \
                or self.num_tokens - self.num_computed != 1 \
                or not eligible(self.req.sampling, self.req.constraint is not None,
                                len(self.output_ids)):
            return ()
        room = self.req.max_tokens - len(self.output_ids) - 1  # a step emits up to k + 1
        return self.spec.proposal(self.req.prompt_token_ids + self.output_ids, room)

    def block_keys(self, block_size: int, num_tokens: int) -> list[BlockKey]:
        """Prefix-cache keys of the full blocks among its first `num_tokens` tokens."""
        full = min(num_tokens, self.num_tokens) // block_size
        if len(self._keys) < full:
            tokens = self.token_ids(0, full * block_size)
            self._keys += block_keys(tokens, block_size, self._salt(), self._keys,
                                     self.req.adapter)
        return self._keys[:full]

    def _salt(self) -> str:
        # NOTE: prompt log-probs need every prompt position through the head: a request
        # that asks for them never hits the prefix cache (as vLLM v1 skips it for them)
        # NOTE: blocks of one model never serve another's requests: its name is in the key
        salt = self.req.cache_salt if not self.req.model else \
            f"{self.req.model}\x00{self.req.cache_salt}"
        if self.req.sampling.prompt_logprobs is None:
            return salt
        return f"{salt}\x00{self.rid}"

    def prompt_targets(self, past: int, num_tokens: int) -> list[int] | None:
        """The prompt tokens that fed tokens [past, past + num_tokens) predict, when the
        request asks for prompt log-probs (None otherwise, or when there are none)."""
        if self.req.sampling.prompt_logprobs is None:
            return None
        end = min(self.prompt_len, past + num_tokens + 1)
        return self.token_ids(past + 1, end - past - 1) if end > past + 1 else None

    def record_prompt_logprobs(self, past: int, scored: list[TokenLogprobs]) -> None:
        """Keep the log-probs of prompt tokens past + 1, ... (a recompute writes them again)."""
        if not self.prompt_logprobs:
            self.prompt_logprobs = [None] * self.prompt_len
        self.prompt_logprobs[past + 1:past + 1 + len(scored)] = scored

    def fed_ids(self, start: int, count: int) -> tuple[list[int], int]:
        """(tokens [start, start + count), how many of them are drafts): its known tokens,
        then the drafts of its proposal (a verify step; kept in `spec.in_flight`)."""
        known = max(0, min(count, self.num_tokens - start))
        num_draft = count - known
        if num_draft == 0:
            return self.token_ids(start, count), 0
        proposal = self._view.draft if self._view is not None else ()
        if self.spec is None or len(proposal) < num_draft:
            raise ValueError(f"{self.rid}: {num_draft} drafted tokens fed, "
                             f"{len(proposal)} proposed")
        self.spec.in_flight = list(proposal[:num_draft])
        return self.token_ids(start, known) + self.spec.in_flight, num_draft

    def token_ids(self, start: int, count: int) -> list[int]:
        """Tokens [start, start + count) of prompt + output."""
        prompt = self.req.prompt_token_ids
        if start + count <= len(prompt):
            return prompt[start:start + count]
        return (prompt + self.output_ids)[start:start + count]

    def emit(self, event: TokenEvent) -> None:
        self.events.put_nowait(event)

    def trace(self, now: float) -> RequestTrace | None:
        """Its `RequestTrace` as of `now`, when it asks for one (for its last event)."""
        if self.journal is None:
            return None
        return self.journal.trace(self.scheduled_time, self.num_preemptions, now)

    # -- the IEG -----------------------------------------------------------------------------
    def frontier(self) -> IEGNode | None:
        """The next node to run: the first unfinished prefill or decode node."""
        return next((n for n in self.nodes if n.kind in (NodeKind.PREFILL, NodeKind.DECODE)
                     and not n.state.is_finished), None)

    def on_admitted(self) -> None:
        if (n := self.frontier()) is not None and n.state in (NodeState.INIT, NodeState.PREEMPTED):
            n.advance(NodeState.READY)

    def on_issued(self) -> None:
        if (n := self.frontier()) is not None:
            walk(n, NodeState.SCHEDULED)

    def on_computed(self) -> None:
        """Nodes whose tokens are all in KV now are COMPLETED."""
        for n in self.nodes:
            if n.kind in (NodeKind.PREFILL, NodeKind.DECODE) and not n.state.is_finished \
                    and n.num_context_tokens + n.num_tokens <= self.num_computed:
                walk(n, NodeState.COMPLETED)

    def on_preempted(self) -> None:
        if (n := self.frontier()) is not None and n.state in (NodeState.READY,
                                                              NodeState.SCHEDULED):
            n.advance(NodeState.PREEMPTED)

    def on_blocked(self) -> None:
        """Its next step waits for KV blocks."""
        if (n := self.frontier()) is not None and n.state is NodeState.READY:
            n.advance(NodeState.BLOCKED)

    def add_decode_node(self) -> IEGNode:
        node = IEGNode(NodeKind.DECODE, len(self.output_ids), 1, self.num_tokens - 1,
                       state=NodeState.READY)
        self.nodes.insert(len(self.nodes) - 1, node)  # before Output
        return node

    def finish(self, reason: FinishReason, error: str | None = None, emit: bool = True) -> None:
        """End the request (DONE) and its IEG's open nodes; `emit` closes the stream too."""
        if self.status is Status.DONE:
            return
        self.status = Status.DONE
        if emit:
            now = time.monotonic()
            self.emit(TokenEvent(None, len(self.output_ids), now, reason, error,
                                 self.num_cached_tokens, trace=self.trace(now)))
        end = {FinishReason.ERROR: NodeState.FAILED, FinishReason.ABORT: NodeState.ABORTED}
        final = end.get(reason)
        for n in self.nodes:
            if n.state.is_finished:
                continue
            if final is None:
                walk(n, NodeState.COMPLETED)
            else:
                n.advance(final)


_PATH = (NodeState.INIT, NodeState.READY, NodeState.SCHEDULED, NodeState.RUNNING,
         NodeState.COMPLETED)


def walk(node: IEGNode, target: NodeState) -> None:
    """Advance `node` along INIT -> READY -> SCHEDULED -> RUNNING -> COMPLETED up to `target`
    (a PREEMPTED or BLOCKED node first goes back to READY)."""
    if node.state in (NodeState.PREEMPTED, NodeState.BLOCKED):
        node.advance(NodeState.READY)
    if _PATH.index(node.state) >= _PATH.index(target):
        return
    for state in _PATH[_PATH.index(node.state) + 1:_PATH.index(target) + 1]:
        node.advance(state)
