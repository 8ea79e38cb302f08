"""The GMG's snapshot for the simulator: what it reports of the ops in flight."""

from __future__ import annotations

from executors.types import OpInstance, OpRole, OpState, Priority
from tests.scheduler.helpers import SHAPE, devices, empty_gmg


def _op(op_id: int, role: OpRole, device: str, est_s: float) -> OpInstance:
    return OpInstance(op_id, "hold" if role is OpRole.HOLD else "layers[0:1]", role, -1,
                      device, Priority.HIGH, SHAPE, ("r",), est_s=est_s)


def test_a_hold_in_flight_ends_now_for_the_simulation_and_weighs_no_load() -> None:
    gmg = empty_gmg(devices(2))
    chain = _op(1, OpRole.COMPUTE, "cpu:0", 0.4)
    queued = _op(2, OpRole.HOLD, "cpu:1", 0.4)
    running = _op(3, OpRole.HOLD, "cpu:1", 0.4)
    gmg.add([chain, queued, running], {})
    for op in (chain, queued, running):
        gmg.mark_issued(op)
        op.state, op.issued_at = OpState.ISSUED, 0.0
    running.state, running.start = OpState.RUNNING, 1.0
    ops = {o.op_id: o for o in gmg.snapshot(1.25).ops}
    assert ops[1].est_s == 0.4 and ops[2].est_s == 0.0
    assert ops[3].est_s == 0.25 and ops[3].start == 1.0  # it ends at the snapshot's now
    assert gmg.loads() == {"cpu:0": 0.4, "cpu:1": 0.0}
