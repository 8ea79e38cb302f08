"""A policy's working copy of one round: the decisions so far and the state they imply.

A policy decides one thing after another (admit this request, issue that
plan); each later choice must see the earlier ones: KV already promised,
requests already in a plan, ops already added to the devices' queues. `Draft`
keeps that, starting from the immutable `RoundView`, and turns it into a
`RoundDecision` at the end. It never touches the scheduler.
"""

from __future__ import annotations

import dataclasses
import traceback
from collections.abc import Callable, Iterable
from typing import TypeVar

from executors.types import Priority
from scheduler.decision import Admission, Failure, Preemption, RoundDecision
from scheduler.gmg import Snapshot
from scheduler.plan import Plan, to_candidate
from scheduler.requestview import Placement, RequestView
from scheduler.simulator import Candidate, Prediction, simulate
from scheduler.view import RoundView

T = TypeVar("T")


class Draft:
    """See the module docstring. Reads are of the view plus this round's decisions."""

    def __init__(self, view: RoundView, sim: Callable[..., Prediction] = simulate) -> None:
        self.view = view
        self._sim = sim  # NOTE: a hook for the simulator bench, which records every call
        self._runnable = {r.rid: r for r in view.runnable}
        self._waiting = {p: {r.rid: r for r in view.waiting.get(p, ())} for p in Priority}
        self._kv_free = dict(view.kv_free_blocks)
        self._load = dict(view.load_s)
        self._prefills = dict(view.prefill_inflight)
        self._decodes = set(view.decode_inflight)
        self._snap = view.snapshot
        self.preempted: set[str] = set()  # requests preempted this round
        self._base: Prediction | None = None
        self.decision = RoundDecision()

    # -- reading -----------------------------------------------------------------------------
    def runnable(self) -> list[RequestView]:
        """Admitted requests not in a plan (of this round or in flight), in view order."""
        return list(self._runnable.values())

    def waiting(self, priority: Priority) -> list[RequestView]:
        """Requests of one class not admitted yet, in arrival order."""
        return list(self._waiting[priority].values())

    def num_waiting(self, priority: Priority) -> int:
        return len(self._waiting[priority])

    def blocks_needed(self, num_tokens: int) -> int:
        return self.view.blocks_for(num_tokens)

    def free_blocks(self, device: str) -> int:
        return self._kv_free.get(device, 0)

    def can_reserve(self, devices: Iterable[str], num_tokens: int) -> bool:
        need = self.blocks_needed(num_tokens)
        return all(need <= self.free_blocks(d) for d in set(devices))

    def load(self, device: str) -> float:
        """Estimated seconds of work queued or running on `device`, this round's included."""
        return self._load.get(device, 0.0)

    def least_loaded(self, devices: Iterable[str]) -> str:
        return min(devices, key=lambda d: (self.load(d), d))

    def prefills(self, device: str, priority: Priority | None = None) -> int:
        """Prefill plans in flight whose first op runs on `device` (of one class, or of all)."""
        classes = list(Priority) if priority is None else [priority]
        return sum(self._prefills.get((device, p), 0) for p in classes)

    def decoding(self, placement: Placement, priority: Priority) -> bool:
        """Whether a decode step of this class is in flight on this placement."""
        return (placement, priority) in self._decodes

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

    def simulate(self, plan: Plan) -> Prediction:
        """Predict the devices with `plan` issued now on top of the snapshot."""
        return self._sim(self.snapshot(), self._candidate(plan))

    def _candidate(self, plan: Plan) -> Candidate:
        if plan.candidate is None:  # NOTE: built once: simulated, then added to the snapshot
            plan.candidate = to_candidate(plan, {}, self.view.now)
        return plan.candidate

    # -- deciding ----------------------------------------------------------------------------
    def admit(self, req: RequestView, placement: Placement) -> RequestView:
        """Reserve its KV on `placement`'s devices; it becomes runnable. Returns its new view."""
        if not self.can_reserve(placement, req.kv_tokens):
            raise ValueError(f"{req.rid}: KV for {req.kv_tokens} tokens does not fit")
        need = self.blocks_needed(req.kv_tokens)
        for d in set(placement):
            self._kv_free[d] -= need
        del self._waiting[req.priority][req.rid]
        admitted = dataclasses.replace(req, placement=placement,
                                       kv_blocks=tuple((d, need) for d in sorted(set(placement))))
        self._runnable[req.rid] = admitted
        self.decision.admissions.append(Admission(req.rid, placement, req.kv_tokens))
        if req.ttft_deadline is not None and req.num_output == 0 and self._snap is not None:
            deadlines = (*self._snap.deadlines, (req.rid, req.ttft_deadline))
            self._snap = dataclasses.replace(self._snap, deadlines=deadlines)
        return admitted

    def preempt(self, req: RequestView, reason: str) -> None:
        """Free a runnable request's KV; it waits again, first of its class."""
        del self._runnable[req.rid]
        for d, blocks in req.kv_blocks:
            self._kv_free[d] = self._kv_free.get(d, 0) + blocks
        queue = self._waiting[req.priority]
        back = dataclasses.replace(req, placement=None, kv_blocks=(), num_computed=0)
        self._waiting[req.priority] = {req.rid: back, **queue}
        self.preempted.add(req.rid)
        self.decision.preemptions.append(Preemption(req.rid, reason))

    def issue(self, plan: Plan) -> None:
        """Add a built plan: its requests leave `runnable`, its ops join the devices' queues."""
        for rid in plan.rids:
            self._runnable.pop(rid, None)
        for op in plan.ops:
            self._load[op.device] = self._load.get(op.device, 0.0) + op.est_s
        if plan.is_prefill:
            key = (plan.placement[0], plan.priority)
            self._prefills[key] = self._prefills.get(key, 0) + 1
        else:
            self._decodes.add((plan.placement, plan.priority))
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
