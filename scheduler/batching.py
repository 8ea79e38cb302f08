"""What every policy needs: the round context, placements, decode groups, prefill packing."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from executors.types import Priority
from scheduler.config import SchedulerConfig
from scheduler.gmg import GMG, Snapshot
from scheduler.ieg import BoundedQueues
from scheduler.kv import KVManager
from scheduler.plan import Builder, Feed, Plan
from scheduler.simulator import Prediction, simulate
from scheduler.state import Placement, RequestState


@dataclass
class RoundContext:
    """What a policy sees and may do in one scheduling round."""

    now: float
    cfg: SchedulerConfig
    devices: list[str]
    num_ops: int  # operators in the chain
    waiting: BoundedQueues[RequestState]  # not admitted yet (no KV)
    runnable: list[RequestState]  # admitted, not in flight, not finished
    kv: KVManager
    builder: Builder
    gmg: GMG
    admit: Callable[[RequestState, Placement], None]  # reserves KV, leaves the waiting queue
    issue: Callable[[Plan], None]  # builds the plan's ops and enqueues them
    preempt: Callable[[RequestState], None]  # frees a runnable request's KV, back to waiting
    prefill_inflight: dict[tuple[str, Priority], int]  # (device, class) -> prefill plans
    decode_inflight: set[Placement]  # placements with a decode step in flight
    tightest_slo_s: float  # smallest TTFT SLO seen, else the default (sizes low-priority chunks)
    # NOTE: the GMG changes within a round only through issue/admit/preempt, so what is
    # derived from it is computed once and dropped by those three.
    _snap: Snapshot | None = field(default=None, repr=False)
    _base: Prediction | None = field(default=None, repr=False)
    _load: dict[str, float] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.issue = self._dropping_cache(self.issue)
        self.admit = self._dropping_cache(self.admit)
        self.preempt = self._dropping_cache(self.preempt)

    def _dropping_cache(self, fn: Callable) -> Callable:
        def call(*args: object) -> None:
            fn(*args)
            self._snap = self._base = self._load = None
        return call

    def snapshot(self) -> Snapshot:
        """The GMG as of this round (cached until the policy changes it)."""
        if self._snap is None:
            self._snap = self.gmg.snapshot(self.now)
        return self._snap

    def baseline(self, sim: Callable[[Snapshot], Prediction] = simulate) -> Prediction:
        """The simulation of the GMG with no new batch (cached like `snapshot`)."""
        if self._base is None:
            self._base = sim(self.snapshot())
        return self._base

    def load(self, device: str) -> float:
        """Estimated seconds of work queued or running on `device`."""
        if self._load is None:
            self._load = dict.fromkeys(self.devices, 0.0)
            for op in self.gmg.scheduled.values():
                self._load[op.device] = self._load.get(op.device, 0.0) + op.est_s
        return self._load.get(device, 0.0)

    def prefills(self, device: str, priority: Priority | None = None) -> int:
        """Prefill plans in flight on `device` (of one class, or of all)."""
        if priority is not None:
            return self.prefill_inflight.get((device, priority), 0)
        return sum(self.prefill_inflight.get((device, p), 0) for p in Priority)

    def least_loaded(self, devices: list[str]) -> str:
        return min(devices, key=lambda d: (self.load(d), d))


def single(device: str, num_ops: int) -> Placement:
    return (device,) * num_ops


def split(first: str, second: str, at: int, num_ops: int) -> Placement:
    """Ops [0, at) on `first`, the rest on `second`."""
    return (first,) * at + (second,) * (num_ops - at)


def decode_plans(ctx: RoundContext, priority_of: Callable[[RequestState], Priority]
                 ) -> list[Plan]:
    """Decode steps of runnable requests: one batch per placement, every class together.

    The batch runs at its most urgent member's class. NOTE: classes share a step because a
    decode step costs mostly its weight reads: a separate one-request high-priority step
    costs about as much as a full low-priority one. A placement with a step in flight is
    skipped, so newcomers join the next step instead of fragmenting the batch.
    """
    groups: dict[Placement, list[RequestState]] = defaultdict(list)
    for s in ctx.runnable:
        if not s.is_prefilling and s.placement is not None \
                and s.placement not in ctx.decode_inflight:
            groups[s.placement].append(s)
    plans = []
    for placement, members in groups.items():
        members.sort(key=lambda s: (priority_of(s), s.req.arrival_time))
        for i in range(0, len(members), ctx.cfg.max_decode_seqs):
            part = members[i:i + ctx.cfg.max_decode_seqs]
            feeds = [Feed(s, s.next_chunk(1), s.num_computed) for s in part]
            plans.append(Plan(min(priority_of(s) for s in part), placement, [feeds]))
    return sorted(plans, key=lambda p: p.priority)


def prefill_feed(state: RequestState, max_tokens: int) -> Feed:
    return Feed(state, state.next_chunk(max_tokens), state.num_computed)


def chunk_feeds(state: RequestState, chunk_tokens: int, num_chunks: int) -> list[list[Feed]]:
    """A prefill cut into `num_chunks` consecutive chunks (a chunked pipeline)."""
    todo = state.next_chunk(chunk_tokens * num_chunks)
    size = -(-len(todo) // num_chunks)
    past = state.num_computed
    chunks = []
    for i in range(0, len(todo), size):
        chunks.append([Feed(state, todo[i:i + size], past + i)])
    return chunks


def kv_tokens(state: RequestState) -> int:
    """KV a request reserves at admission: everything it may ever hold."""
    return state.prompt_len + state.req.max_tokens
