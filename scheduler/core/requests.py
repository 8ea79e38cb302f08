"""The scheduler's requests: their records, the waiting queues, and the KV each one holds.

`Requests` commits what a round decided about a request's KV and status
(admit, preempt, migrate, grow) and ends requests; each commit checks the
request is in the status the decision assumed and raises otherwise, so a
stale decision fails loudly instead of corrupting state. Plans in flight are
the scheduler's business (scheduler/scheduler.py). With prefix caching it also
looks up waiting requests' cached prefixes for the policies, pins the hits an
admission takes, and registers computed blocks (`cache`).
"""

from __future__ import annotations

from executors.types import Priority
from models.template import GraphTemplate
from scheduler.api import FinishReason, Overloaded
from scheduler.config import QueueLimits
from scheduler.core.admission import WaitingQueues, Weight
from scheduler.core.state import RequestState, Status
from scheduler.memory.kv import KVManager, layer_devices
from scheduler.round.decision import Admission, Growth, Migration, Preemption
from scheduler.round.requestview import RequestView
from scheduler.sim.gmg import GMG

# NOTE: looking up a waiting request's cached prefix costs a dict lookup per block and
# device every round; only the first ones of each class (those a round can admit) do it.
LOOKUPS_PER_CLASS = 64


class Requests:
    """Request records by id, waiting queues per class, and KV commits (see module doc)."""

    def __init__(self, kv: KVManager, gmg: GMG, template: GraphTemplate,
                 limits: QueueLimits) -> None:
        self.kv, self.gmg, self.template = kv, gmg, template
        self.states: dict[str, RequestState] = {}
        self.waiting: WaitingQueues[RequestState] = WaitingQueues(limits)
        self.preemptions: dict[tuple[str, str, str], int] = {}  # (model, tenant, class) ->
        # count
        self.swapped_out_bytes = 0  # KV copied to host memory by preemptions, cumulative
        self.dropped_tokens = 0  # tokens of KV dropped by preemptions (to recompute)
        self.block_size = kv.block_size

    def add(self, state: RequestState, weight: Weight | None = None) -> list[RequestState]:
        """Queue a new request; returns those it evicted (still to be shed by `shed`).
        Raises Overloaded (with its reason) when it is the one shed. `weight`: a tenant's
        service so far (fair shedding within a class), else 0 for all."""
        verdict = self.waiting.verdict(state, weight) if weight else self.waiting.verdict(state)
        evicted = self.waiting.push(state, verdict)
        self.states[state.rid] = state
        return evicted

    def shed(self, state: RequestState, why: Overloaded) -> None:
        """End a request evicted from its queue; its stream raises `why`."""
        state.shed = why
        self.end(state, FinishReason.ERROR, str(why))

    def age(self, before: float) -> list[RequestState]:
        """Move low requests waiting since before `before` (monotonic s) into the normal
        class, in arrival order; returns them."""
        old = [s for s in self.waiting.queue(Priority.LOW)
               if s.status is Status.WAITING and s.req.arrival_time <= before]
        for s in old:
            self.waiting.remove(s.rid)
            s.req.priority = Priority.NORMAL
            self.waiting.requeue(s, front=False)
        return old

    def get(self, rid: str) -> RequestState | None:
        return self.states.get(rid)

    def views(self) -> tuple[tuple[RequestView, ...], tuple[RequestView, ...],
                             dict[Priority, tuple[RequestView, ...]]]:
        """(runnable, running, waiting per class) requests as policies see them."""
        caching = self.kv.prefix_caching
        held = [s for s in self.states.values() if s.status.holds_kv]
        views = {s.rid: s.view(shared=self.kv.shared_blocks(s.rid) if caching else ())
                 for s in held}
        runnable = tuple(views[s.rid] for s in held if s.status is Status.RUNNABLE)
        running = tuple(views[s.rid] for s in held if s.status is Status.RUNNING)
        waiting = {p: tuple(s.view(self._cached(s) if caching and i < LOOKUPS_PER_CLASS else ())
                            for i, s in enumerate(self.waiting.queue(p))) for p in Priority}
        return runnable, running, waiting

    def _cached(self, state: RequestState) -> tuple[tuple[str, int, int], ...]:
        """(device, cached tokens, unreferenced blocks among them) where its prefix hits.

        NOTE: at most all but its last token: the head needs that token's hidden state."""
        if state.status is not Status.WAITING:
            return ()
        keys = state.block_keys(self.block_size, state.num_tokens - 1)
        out = []
        for d in self.kv.devices:
            hit, unreferenced = self.kv.cached_prefix(d, keys, state.req.model)
            if hit:
                out.append((d, hit * self.block_size, unreferenced))
        return tuple(out)

    def pin(self, a: Admission) -> None:
        """Take the cached blocks an admission counts on before any allocation can evict them."""
        if a.num_cached:
            state = self._expect(a.rid, Status.WAITING)
            keys = state.block_keys(self.block_size, a.num_cached)
            self.kv.pin(a.rid, a.placement[0], keys, a.num_cached // self.block_size,
                        state.req.model)

    def cache(self, state: RequestState) -> None:
        """Register its computed full blocks in the prefix cache (one device holds them all)."""
        full = state.num_computed // self.block_size
        if full > state.num_registered and state.placement is not None \
                and len(set(state.placement)) == 1:
            keys = state.block_keys(self.block_size, state.num_computed)
            self.kv.register(state.rid, state.placement[0], keys)
            state.num_registered = full

    # -- commits -----------------------------------------------------------------------------
    def admit(self, a: Admission) -> RequestState:
        state = self._expect(a.rid, Status.WAITING, Status.SWAPPED)
        devices = set(a.placement)
        if state.status is Status.SWAPPED:
            layers = layer_devices(self.template, a.placement, state.req.model)
            state.tables = self.kv.swap_in(a.rid, devices, a.kv_tokens, layers).tables
        else:
            state.tables = self.kv.reserve(a.rid, devices, a.kv_tokens, state.req.model).tables
            state.num_computed = a.num_cached
            if not state.output_ids and not state.num_preemptions:
                state.num_cached_tokens = a.num_cached
        self.waiting.remove(a.rid)
        state.placement, state.status = a.placement, Status.RUNNABLE
        state.num_registered = 0
        state.on_admitted()
        state.on_computed()
        if state.req.ttft_deadline is not None and not state.output_ids:
            self.gmg.deadlines[a.rid] = state.req.ttft_deadline
        return state

    def preempt(self, p: Preemption) -> RequestState:
        state = self._expect(p.rid, Status.RUNNABLE)
        assert state.placement is not None
        if p.swap:
            layers = layer_devices(self.template, state.placement, state.req.model)
            self.kv.swap_out(p.rid, state.num_computed, layers)
            self.swapped_out_bytes += self.kv.swapped[p.rid].num_bytes
            state.status = Status.SWAPPED
        else:
            self.kv.free(p.rid)
            self.dropped_tokens += state.num_computed
            state.num_computed, state.status = 0, Status.WAITING
        state.placement, state.tables = None, {}
        state.num_preemptions += 1
        key = (state.req.model, state.req.tenant, state.priority.label)
        self.preemptions[key] = self.preemptions.get(key, 0) + 1
        state.on_preempted()
        self.waiting.requeue(state)
        return state

    def migrate(self, m: Migration) -> RequestState:
        state = self._expect(m.rid, Status.RUNNABLE)
        assert state.placement is not None
        layers = layer_devices(self.template, state.placement, state.req.model)
        self.kv.migrate(m.rid, state.num_computed, layers, m.target)
        state.placement = (m.target,) * len(state.placement)
        return state

    def grow(self, g: Growth) -> RequestState:
        state = self._expect(g.rid, Status.RUNNABLE)
        self.kv.grow(g.rid, g.num_tokens)
        return state

    def end(self, state: RequestState, reason: FinishReason, error: str | None = None,
            emit: bool = True) -> None:
        """Finish a request not in flight: close its stream (unless its last token event did)
        and free its KV, on devices or in host memory."""
        if state.status.is_queued:
            self.waiting.remove(state.rid)
        state.finish(reason, error, emit=emit)
        self.kv.free(state.rid)
        self.gmg.deadlines.pop(state.rid, None)
        self.states.pop(state.rid, None)

    def _expect(self, rid: str, *statuses: Status) -> RequestState:
        state = self.states.get(rid)
        if state is None or state.status not in statuses or state.ending is not None:
            now = "gone" if state is None else state.status.value
            raise ValueError(f"{rid} is {now}, not {' or '.join(s.value for s in statuses)}")
        return state
