import json
from pathlib import Path

import pytest

from benchmarks.scheduler.simulator import (
    SHAPE,
    RecordedPolicy,
    Recorder,
    _replay,
    _report,
    cpu_share,
    idle_gaps,
    main,
    op_ratios,
    prediction_error,
    speed,
    synthetic_gmg,
    twin_spread,
)
from executors.types import OpInstance, OpRole, Priority
from scheduler.policies.slice import SlicePolicy
from scheduler.sim import native as simloop
from scheduler.sim.simulator import simulate
from scheduler.sim.types import Prediction
from tests.scheduler.views import make_view, req


def test_the_shared_snapshot_takes_the_interference_path() -> None:
    solo = simulate(synthetic_gmg(2, 400).snapshot(0.0))
    shared = simulate(synthetic_gmg(2, 400, shared=True).snapshot(0.0))
    assert solo.finish.keys() == shared.finish.keys()
    assert shared.end > solo.end  # the same ops, slowed where they overlap on the host


def test_speed_reports_every_device_count() -> None:
    for shared in (False, True):
        out = speed([2, 8], 200, 1, shared=shared)
        assert set(out) == {"2", "8"} and all(v > 0 for v in out.values())


def test_parts_run_alone_and_write_their_json(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sim.json"
    result = main(["--parts", "speed", "--ops", "200", "--repeats", "1", "--json", str(out)])
    assert set(result["ops_per_ms"]) == set(result["ops_per_ms_shared"]) == {"2", "8", "64"}
    assert set(result["ops_per_ms_python"]) == set(result["ops_per_ms_shared_python"]) == {
        "2", "8", "64"}
    assert "rounds" not in result and "accuracy" not in result
    assert json.loads(out.read_text())["ops_per_ms"] == result["ops_per_ms"]
    assert "simulated ops/ms" in capsys.readouterr().out


def test_unknown_parts_are_refused() -> None:
    with pytest.raises(SystemExit):
        main(["--parts", "speed,nothing"])


def test_replay_times_every_round_that_simulated() -> None:
    snap = synthetic_gmg(2, 80, shared=True).snapshot(0.0)
    recorder = Recorder(calls=[(0, snap, None), (0, snap, None), (3, snap, None)])
    assert set(_replay(recorder)) == {0, 3}
    # built again on its first simulation, then shared (the C loop's graph where it runs)
    assert ("native" if simloop.library() is not None else "graph") in snap.cache


def test_the_accuracy_report_shows_every_repeat(capsys: pytest.CaptureFixture[str]) -> None:
    twins = {"twin_e2e_spread": 0.031, "twin_request_spread": 0.052}
    runs = [{"e2e_actual_s": a, "e2e_predicted_s": 0.5, "e2e_error": abs(0.5 - a) / a,
             "request_mape": 0.04, **twins} for a in (0.52, 0.55)]
    acc = {"e2e_actual_s": 0.535, "e2e_predicted_s": 0.5, "e2e_error": 0.065,
           "request_mape": 0.04, "runs": runs, **twins}
    _report({"accuracy": acc}, 200, 2)
    out = capsys.readouterr().out
    assert "error 6.50%" in out and "repeat 2: predicted 0.500 s, actual 0.550 s" in out
    assert "differ by 3.10% end-to-end, 5.20% per request" in out
    assert "twins 3.10% / 5.20%" in out
    assert "without learning" not in out
    _report({"accuracy": {**acc, "op_ratio_layers": 1.3, "op_ratio_head": 0.9}}, 200, 2)
    assert "per op kind (medians): layers 1.30x, head 0.90x" in capsys.readouterr().out
    _report({"accuracy": {**acc, "gap_actual_s": 0.0123, "gap_predicted_s": 0.0021,
                          "cpu_share": 0.934}}, 200, 2)
    assert "measured 12.3 ms, predicted 2.1 ms; ops' CPU over wall time 0.93" in \
        capsys.readouterr().out
    _report({"accuracy": {**acc, "without_learning": {**acc, "e2e_error": 0.0812}}}, 200, 2)
    out = capsys.readouterr().out
    assert "accuracy: end-to-end" in out and "error 6.50%" in out
    assert "without learning co-location online: end-to-end" in out and "error 8.12%" in out


def test_op_ratios_weigh_each_kind_by_time_and_skip_ops_that_never_ran() -> None:
    spans = {0: ("embed", 0.0, 0.01, 0.0, 0.01), 1: ("layers[0:5]", 0.01, 0.05, 0.01, 0.03),
             2: ("layers[5:10]", 0.05, 0.11, 0.03, 0.06), 3: ("head", 0.11, 0.115, 0.06, 0.07),
             4: ("head", None, None, 0.07, 0.08)}  # (name, ran from, to, predicted from, to)
    ops = [OpInstance(i, name, OpRole.COMPUTE, i, "cpu:0", Priority.HIGH, SHAPE, ("r",),
                      start=a, end=b) for i, (name, a, b, _, _) in spans.items()]
    pred = Prediction({i: s[3] for i, s in spans.items()}, {i: s[4] for i, s in spans.items()},
                      {}, {}, False, 0.08)
    # layers ran 0.04 + 0.06 s against 0.02 + 0.03 predicted; head 5 ms against 10
    assert op_ratios(pred, ops) == pytest.approx(
        {"op_ratio_embed": 1.0, "op_ratio_head": 0.5, "op_ratio_layers": 2.0})


def test_idle_gaps_count_each_device_between_its_first_start_and_last_end() -> None:
    # (device, ran from, to, predicted from, to): the run leaves 2 ms between ops 0 and 1
    # and 1 ms between 2 and 3 (op 3 overlaps nothing on cpu:1 before it); predicted back to back
    spans = {0: ("cpu:0", 0.0, 0.010, 0.0, 0.010), 1: ("cpu:0", 0.012, 0.020, 0.010, 0.018),
             2: ("cpu:1", 0.005, 0.015, 0.005, 0.015), 3: ("cpu:1", 0.016, 0.020, 0.015, 0.019),
             4: ("cpu:0", None, None, 0.030, 0.040)}  # never ran: left out on both sides
    ops = [OpInstance(i, "layers[0:5]", OpRole.COMPUTE, 1, dev, Priority.LOW, SHAPE, ("r",),
                      start=a, end=b) for i, (dev, a, b, _, _) in spans.items()]
    pred = Prediction({i: s[3] for i, s in spans.items()}, {i: s[4] for i, s in spans.items()},
                      {}, {}, False, 0.04)
    assert idle_gaps(pred, ops) == pytest.approx({"gap_actual_s": 0.003, "gap_predicted_s": 0.0})


def test_cpu_share_is_cpu_over_wall_time_of_the_ops_the_executor_timed() -> None:
    def op(i: int, wall: float, cpu: float | None) -> OpInstance:
        return OpInstance(i, "head", OpRole.COMPUTE, 7, "cpu:0", Priority.LOW, SHAPE, ("r",),
                          start=0.0, end=wall, cpu_s=cpu)

    assert cpu_share([op(0, 0.010, 0.008), op(1, 0.030, 0.024), op(2, 0.5, None)]) == \
        pytest.approx({"cpu_share": 0.8})
    assert cpu_share([op(0, 0.010, None)]) == {}


def test_prediction_error_and_the_spread_of_identical_runs() -> None:
    err = prediction_error([1.0, 2.0], [1.25, 2.5])
    assert err == {"e2e_actual_s": 2.5, "e2e_predicted_s": 2.0, "e2e_error": 0.2,
                   "request_mape": 0.2}
    # the second run scored as if it were a prediction of the first
    assert twin_spread([1.0, 2.0], [1.1, 1.8]) == pytest.approx(
        {"twin_e2e_spread": 0.1, "twin_request_spread": 0.1})
    assert twin_spread([1.0, 2.0], [1.0, 2.0]) == {"twin_e2e_spread": 0.0,
                                                   "twin_request_spread": 0.0}


def test_the_recorded_policy_decides_as_the_policy_and_records_each_round() -> None:
    hp = req("hp", Priority.HIGH, prompt=40, slo=1.0)
    views = [make_view(), make_view(waiting=[hp])]  # a round with nothing to place, then hp
    recorder = Recorder()
    recorded, alone = RecordedPolicy(recorder), SlicePolicy()
    for view in views:
        got, want = recorded.schedule(view), alone.schedule(view)
        assert [p.placement for p in got.plans] == [p.placement for p in want.plans]
        assert got.admissions == want.admissions
    assert len(recorder.round_s) == 2 and all(t > 0 for t in recorder.round_s)
    assert recorder.calls and {rnd for rnd, _, _ in recorder.calls} == {1}
    assert (recorded.name, recorded.uses_simulation) == ("slice", True)
