from scheduler.bench.simulator import speed, synthetic_gmg
from scheduler.simulator import simulate


def test_the_shared_snapshot_takes_the_interference_path() -> None:
    solo = simulate(synthetic_gmg(2, 400).snapshot(0.0))
    shared = simulate(synthetic_gmg(2, 400, shared=True).snapshot(0.0))
    assert solo.finish.keys() == shared.finish.keys()
    assert shared.end > solo.end  # the same ops, slowed where they overlap on the host


def test_speed_reports_every_device_count() -> None:
    for shared in (False, True):
        out = speed([2, 8], 200, 1, shared=shared)
        assert set(out) == {"2", "8"} and all(v > 0 for v in out.values())
