"""The scaling bench: one prefill's candidates over a synthetic snapshot per device count."""

from __future__ import annotations

from benchmarks.scheduler.scaling import scaling


def test_one_candidate_per_device_plus_a_split_over_plans_in_flight() -> None:
    small, large = scaling([2, 16], plans_per_device=2, repeats=1)
    assert (small["ops_in_flight"], small["candidates"]) == (32, 3)
    assert (large["ops_in_flight"], large["candidates"]) == (256, 17)
    assert small["decision_s"] > 0 and 1e-3 <= large["median_op_s"] <= 2e-2
