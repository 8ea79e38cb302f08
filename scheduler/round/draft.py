"""A policy's working copy of one round: the decisions so far and the state they imply.

A policy decides one thing after another (admit this request, grow that one's
KV, issue a plan); each later choice must see the earlier ones: KV already
promised or freed, requests already in a plan or preempted, ops already added
to the devices' queues. `Draft` keeps that, starting from the immutable
`RoundView`, and turns it into a `RoundDecision`. It never touches the
scheduler.
"""

from __future__ import annotations

import dataclasses
import traceback
from collections.abc import Callable, Iterable
from typing import TypeVar

from executors.types import Priority
from scheduler.round.decision import (
    Admission,
    Failure,
    Growth,
    Migration,
    Preemption,
    RoundDecision,
)
from scheduler.round.plan import Plan, to_candidate
from scheduler.round.requestview import Placement, RequestView
from scheduler.round.view import RoundView
from scheduler.sim.gmg import SimOp, Snapshot
from scheduler.sim.simulator import simulate
from scheduler.sim.types import Candidate, Prediction

T = TypeVar("T")


class Draft:
    """See the module docstring. Reads are of the view plus this round's decisions."""

    def __init__(self, view: RoundView, sim: Callable[..., Prediction] = simulate) -> None:
        self.view = view
        self._sim = sim  # the policy's simulator (a bench may pass one that records calls)
        self._runnable = {r.rid: r for r in view.runnable}
        self._waiting = {p: {r.rid: r for r in view.waiting.get(p, ())} for p in Priority}
        self._kv_free = dict(view.kv_free_blocks)
        self._host_free = view.host_free_bytes
        self._load = dict(view.load_s)
        self._prefills = dict(view.prefill_inflight)
        self._decodes = set(view.decode_inflight)
        self._snap = view.snapshot
        self._base: Prediction | None = None
        self.preempted: set[str] = set()  # requests preempted this round
        self._queued: dict[str, RequestView] = {}  # admitted this round: its waiting view
        self._taken: dict[str, int] = {}  # admitted this round: free blocks it took per device
        self._step_ends = dict(view.step_ends)  # request -> last op of its plan issued
        self.decision = RoundDecision()

    # -- reading -----------------------------------------------------------------------------
    def runnable(self) -> list[RequestView]:
        """Admitted requests not in a plan (of this round or in flight), in view order."""
        return list(self._runnable.values())

    def is_runnable(self, rid: str) -> bool:
        return rid in self._runnable

    def waiting(self, priority: Priority) -> list[RequestView]:
        """Requests of one class not admitted yet, in queue order (resumed ones first)."""
        return list(self._waiting[priority].values())

    def is_waiting(self, req: RequestView) -> bool:
        """Whether `req` still waits for admission (not admitted or dropped this round)."""
        return req.rid in self._waiting[req.priority]

    def num_waiting(self, priority: Priority) -> int:
        return len(self._waiting[priority])

    def blocks_needed(self, num_tokens: int) -> int:
        return self.view.blocks_for(num_tokens)

    def free_blocks(self, device: str, model: str = "") -> int:
        """Free blocks of `model`'s KV pool on `device`."""
        return self._kv_free.get(self.view.pool(device, model), 0)

    def room(self, device: str, model: str = "") -> int:
        """Blocks an admission of `model` may take on `device`: those free above its pool's
        watermark."""
        return self.free_blocks(device, model) - \
            self.view.kv_watermark_blocks.get(self.view.pool(device, model), 0)

    def can_reserve(self, devices: Iterable[str], num_tokens: int, model: str = "") -> bool:
        """Whether an admission of `num_tokens` fits on `devices` above their watermark."""
        need = self.blocks_needed(num_tokens)
        return all(need <= self.room(d, model) for d in set(devices))

    def _free(self, device: str, model: str, blocks: int) -> None:
        """Count `blocks` more free (fewer, when negative) in `model`'s pool on `device`."""
        key = self.view.pool(device, model)
        self._kv_free[key] = self._kv_free.get(key, 0) + blocks

    def load(self, device: str) -> float:
        """Estimated seconds of work queued or running on `device`, this round's included."""
        return self._load.get(device, 0.0)

    def least_loaded(self, devices: Iterable[str]) -> str:
        return min(devices, key=lambda d: (self.load(d), d))

    def prefills(self, device: str, priority: Priority | None = None) -> int:
        """Prefill plans in flight whose first op runs on `device` (of one class, or of all)."""
        classes = list(Priority) if priority is None else [priority]
        return sum(self._prefills.get((device, p), 0) for p in classes)

    def step_end(self, rid: str) -> int | None:
        """The last op of the plan in flight (or issued this round) carrying `rid`, where the
        view tracks it (running requests with a TPOT SLO) or this round issued it."""
        return self._step_ends.get(rid)

    def decoding(self, placement: Placement) -> bool:
        """Whether a decode step is in flight on this placement."""
        return placement in self._decodes

    # -- simulation --------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        """The GMG with this round's plans added (ops issued now)."""
        if self._snap is None:
            raise ValueError("this policy's view carries no GMG snapshot")
        return self._snap

    def baseline(self) -> Prediction:
        """The simulation of the snapshot with nothing new (cached until the draft changes)."""
        if self._base is None:
            self._base = self._sim(self.snapshot(), None)
        return self._base

    def simulate(self, plan: Plan | None, extra: tuple[SimOp, ...] = ()) -> Prediction:
        """Predict the devices with `plan` (if any) issued now on top of the snapshot, and
        the `extra` ops beside it (work not issued yet that a check weighs it against)."""
        if plan is None:
            return self._sim(self.snapshot(), Candidate(extra)) if extra else self.baseline()
        cand = self._candidate(plan)
        if extra:
            cand = Candidate((*cand.ops, *extra), cand.kv_bytes)
        return self._sim(self.snapshot(), cand)

    def _candidate(self, plan: Plan) -> Candidate:
        if plan.candidate is None:  # NOTE: built once: simulated, then added to the snapshot
            plan.candidate = to_candidate(plan, {}, self.view.now)
        return plan.candidate

    # -- KV ----------------------------------------------------------------------------------
    def admission_tokens(self, req: RequestView) -> int:
        """Tokens of KV an admission reserves: its tokens so far (`kv_admission` "on-demand"),
        or everything it may ever hold ("full", the old rule)."""
        if self.view.cfg.kv_admission == "full":
            return req.prompt_len + req.max_tokens
        return req.kv_tokens

    def cached_tokens(self, req: RequestView, placement: Placement) -> int:
        """Tokens of a waiting request's prefix cached where `placement` runs it (a hit counts
        only when one device runs the whole chain: it holds every layer's KV)."""
        if req.placement is not None or req.swapped or len(set(placement)) != 1:
            return 0
        return next((n for d, n, _ in req.cached if d == placement[0]), 0)

    def on(self, req: RequestView, placement: Placement) -> RequestView:
        """A waiting request as admitted on `placement` would start: after its cached prefix."""
        cached = self.cached_tokens(req, placement)
        return dataclasses.replace(req, num_computed=cached) if cached else req

    def admission_blocks(self, req: RequestView, placement: Placement) -> int:
        """Free blocks admitting `req` on `placement` takes on each of its devices: those its
        uncached tokens need, plus the cached blocks no request holds (they leave the
        evictable ones)."""
        need = self.blocks_needed(self.admission_tokens(req))
        cached = self.cached_tokens(req, placement)
        if not cached:
            return need
        revive = next(n for d, t, n in req.cached if d == placement[0])
        return need - self.blocks_needed(cached) + revive

    def can_admit(self, req: RequestView, placement: Placement) -> bool:
        """Whether admitting `req` on `placement` fits above the devices' watermarks (and its
        model runs there: `RoundView.may_place`)."""
        if not self.view.may_place(req, placement):
            return False
        need = self.admission_blocks(req, placement)
        return all(need <= self.room(d, req.model) for d in set(placement))

    def admit(self, req: RequestView, placement: Placement) -> RequestView:
        """Reserve its KV on `placement`'s devices; it becomes runnable, after its cached
        prefix if it has one there. Returns its new view."""
        tokens = self.admission_tokens(req)
        if not self.can_admit(req, placement):
            raise ValueError(f"{req.rid}: KV for {tokens} tokens does not fit")
        take, cached = self.admission_blocks(req, placement), self.cached_tokens(req, placement)
        for d in set(placement):
            self._free(d, req.model, -take)
        if req.swapped:
            self._host_free += self._swap_bytes(req.num_computed, req.model)
        del self._waiting[req.priority][req.rid]
        self._queued[req.rid], self._taken[req.rid] = req, take
        need = self.blocks_needed(tokens)
        admitted = dataclasses.replace(req, placement=placement, swapped=False, cached=(),
                                       num_computed=cached or req.num_computed,
                                       kv_blocks=tuple((d, need) for d in sorted(set(placement))))
        self._runnable[req.rid] = admitted
        self.decision.admissions.append(Admission(req.rid, placement, tokens, cached))
        if req.ttft_deadline is not None and req.num_output == 0 and self._snap is not None:
            deadlines = (*self._snap.deadlines, (req.rid, req.ttft_deadline))
            self._snap = dataclasses.replace(self._snap, deadlines=deadlines)
        return admitted

    def grow(self, req: RequestView, num_tokens: int) -> bool:
        """Grow a runnable request's KV to `num_tokens` tokens, if its devices have the blocks."""
        r = self._runnable[req.rid]
        need = {d: n for d, held in r.kv_blocks
                if (n := self.blocks_needed(num_tokens) - held) > 0}
        if any(n > self.free_blocks(d, r.model) for d, n in need.items()):
            return False
        if need:
            for d, n in need.items():
                self._free(d, r.model, -n)
            held = tuple((d, b + need.get(d, 0)) for d, b in r.kv_blocks)
            self._runnable[req.rid] = dataclasses.replace(r, kv_blocks=held)
            self.decision.growths.append(Growth(req.rid, num_tokens))
        return True

    def preempt(self, req: RequestView, reason: str) -> None:
        """Take a runnable request's KV off its devices; it waits again, first of its class.
        Its KV goes to host memory while the swap space has room, else it will recompute.

        NOTE: this round's growth or migration of it is dropped; if it was admitted this
        round, the admission is undone instead (it waits as it did)."""
        r = self._runnable.pop(req.rid)
        taken = self._taken.pop(r.rid, None)  # NOTE: admitted this round: it gives that back
        for d, _ in r.kv_blocks:
            freed = r.blocks_freed(d) if taken is None else taken + r.blocks_held(d) - \
                self.blocks_needed(self.admission_tokens(self._queued[r.rid]))
            self._free(d, r.model, freed)
        dec = self.decision
        dec.growths = [g for g in dec.growths if g.rid != r.rid]
        dec.migrations = [m for m in dec.migrations if m.rid != r.rid]
        if r.rid in self._queued:
            self._unadmit(self._queued.pop(r.rid))
            return
        swap = r.num_computed > 0 and \
            self._swap_bytes(r.num_computed, r.model) <= self._host_free
        if swap:
            self._host_free -= self._swap_bytes(r.num_computed, r.model)
        back = dataclasses.replace(r, placement=None, kv_blocks=(), swapped=swap,
                                   num_computed=r.num_computed if swap else 0)
        self._waiting[r.priority] = {r.rid: back, **self._waiting[r.priority]}
        self.preempted.add(r.rid)
        self.decision.preemptions.append(Preemption(r.rid, reason, swap))

    def _unadmit(self, queued: RequestView) -> None:
        self.decision.admissions = [a for a in self.decision.admissions if a.rid != queued.rid]
        if queued.swapped:
            self._host_free -= self._swap_bytes(queued.num_computed, queued.model)
        self._waiting[queued.priority] = {queued.rid: queued, **self._waiting[queued.priority]}
        self.preempted.add(queued.rid)

    def migrate(self, req: RequestView, target: str) -> RequestView:
        """Gather a runnable request's KV onto `target`, which must already hold its table."""
        r = self._runnable[req.rid]
        for d, blocks in r.kv_blocks:
            if d != target:
                self._free(d, r.model, blocks)
        moved = dataclasses.replace(r, placement=(target,) * len(r.placement or ()),
                                    kv_blocks=((target, r.blocks_held(target)),))
        self._runnable[r.rid] = moved
        self.decision.migrations.append(Migration(r.rid, target))
        return moved

    def block(self, req: RequestView) -> None:
        """Its next step waits for KV blocks (it stays runnable, holding what it has)."""
        self.decision.blocked.append(req.rid)

    def _swap_bytes(self, num_tokens: int, model: str = "") -> int:
        return self.blocks_needed(num_tokens) * self.view.block_bytes(model)

    # -- plans -------------------------------------------------------------------------------
    def issue(self, plan: Plan) -> None:
        """Add a built plan: its requests leave `runnable`, its ops join the devices' queues."""
        for rid in plan.rids:
            self._runnable.pop(rid, None)
            if plan.finals:
                self._step_ends[rid] = plan.finals[-1].op_id
        for op in plan.ops:
            self._load[op.device] = self._load.get(op.device, 0.0) + op.est_s
        if plan.is_prefill:
            key = (plan.placement[0], plan.priority)
            self._prefills[key] = self._prefills.get(key, 0) + 1
        else:
            self._decodes.add(plan.placement)
        if self._snap is not None:
            ops = (*self._snap.ops, *self._candidate(plan).ops)
            self._snap = dataclasses.replace(self._snap, ops=ops)
        self._base = None
        self.decision.plans.append(plan)

    def attempt(self, rids: Iterable[str], fn: Callable[[], T]) -> T | None:
        """Run one decision step; if it raises, its requests fail and the round goes on."""
        try:
            return fn()
        except Exception as e:  # NOTE: a policy bug ends these requests, never the scheduler
            rids = tuple(rids)
            self.decision.failures.append(
                Failure(rids, f"{type(e).__name__}: {e}", traceback.format_exc()))
            for rid in rids:
                self._runnable.pop(rid, None)
                for queue in self._waiting.values():
                    queue.pop(rid, None)
            return None

    def hold_back(self) -> None:
        """Note that work was held back only by predicted device state (see RoundDecision)."""
        self.decision.retry_on_progress = True
