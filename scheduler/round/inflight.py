"""The plans in flight: which plan each op and request belongs to, and what the rounds count.

The executors report completions on their own threads; `urgent` holds the op
ids whose completion must wake the event loop at once (every chunk's last op,
and every op of a cancelled plan); it is read from those threads (a set
lookup) and written on the loop.
"""

from __future__ import annotations

from collections import Counter

from executors.types import Priority
from scheduler.round.plan import Plan
from scheduler.round.requestview import Placement, RequestView


class InFlight:
    """Plans issued and not done, indexed by op and by request."""

    def __init__(self) -> None:
        self.finals: dict[int, tuple[Plan, int]] = {}  # final op id -> (plan, chunk index)
        self.by_op: dict[int, Plan] = {}  # op id -> its plan
        self.by_request: dict[str, Plan] = {}  # request id -> its plan
        self.urgent: set[int] = set()  # op ids whose completion wakes the loop at once
        self.prefills: dict[tuple[str, Priority], int] = {}  # (first device, class) -> plans
        self.decodes: set[Placement] = set()  # placements with a decode step in flight
        # (placement, class) -> decode steps in flight there at that class
        self.decode_classes: Counter[tuple[Placement, Priority]] = Counter()

    def add(self, plan: Plan) -> None:
        for i, final in enumerate(plan.finals):
            self.finals[final.op_id] = (plan, i)
            self.urgent.add(final.op_id)
        for op in plan.ops:
            self.by_op[op.op_id] = plan
        for rid in plan.rids:
            self.by_request[rid] = plan
        if plan.is_prefill:
            key = (plan.placement[0], plan.priority)
            self.prefills[key] = self.prefills.get(key, 0) + 1
        else:
            self.decodes.add(plan.placement)
            self.decode_classes[(plan.placement, plan.priority)] += 1

    def step_ends(self, running: tuple[RequestView, ...]) -> dict[str, int]:
        """Request -> the last op of its plan in flight, for running requests with a pace."""
        plans = ((r.rid, self.by_request.get(r.rid)) for r in running if r.is_paced)
        return {rid: plan.finals[-1].op_id for rid, plan in plans if plan and plan.finals}

    def cancel(self, plan: Plan) -> None:
        """Its request was withdrawn: every op's completion now matters at once."""
        plan.cancelled = True
        self.urgent.update(op.op_id for op in plan.ops)

    def remove(self, plan: Plan) -> list[str]:
        """Forget a finished plan; returns the requests it still held (in feed order)."""
        if plan.is_prefill:
            self.prefills[(plan.placement[0], plan.priority)] -= 1
        else:
            self.decodes.discard(plan.placement)
            key = (plan.placement, plan.priority)
            self.decode_classes[key] -= 1
            if self.decode_classes[key] <= 0:
                del self.decode_classes[key]
        for op in plan.ops:
            self.by_op.pop(op.op_id, None)
            self.finals.pop(op.op_id, None)
            self.urgent.discard(op.op_id)
        held = [rid for rid in plan.rids if self.by_request.get(rid) is plan]
        for rid in held:
            del self.by_request[rid]
        return held
