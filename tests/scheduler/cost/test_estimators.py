"""Estimators: least-squares fit and online RLS on synthetic data, lookup rules, persistence."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

import scheduler.cost.profiling as profiling
from executors.types import OpInstance, OpRole, OpState, Priority
from models.batch import BatchShape
from models.choices import PORTABLE, KernelChoice, LayerChoice
from models.linear import INVARIANT_ROWS
from models.loader import load
from scheduler.cost.estimators import Estimators
from scheduler.cost.features import op_features, runs_native
from scheduler.cost.profiling import Sweep, load_or_profile

# true seconds per num_tokens, attn_work, num_seqs, num_sampled, num_context_tokens,
# native_rows (none here: at one native row the column is zero), gemm_rows, const
TRUE_LAYERS = (8e-5, 1.6e-7, 2e-5, 0.0, 3e-7, 0.0, 1.5e-3, 3e-3)
TRUE_XFER = (2e-11, 1.5e-6)  # per byte, const


def _shapes(n: int, seed: int = 0) -> list[BatchShape]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        if rng.random() < 0.5:  # a prefill, maybe a chunk on top of KV
            t, past = rng.randint(4, 400), rng.choice([0, 0, rng.randint(16, 400)])
            out.append(BatchShape(t, 1, 1, t * (t + past), t + past))
        else:  # a decode batch
            b, ctx = rng.choice([1, rng.randint(2, 32)]), rng.randint(16, 512)
            out.append(BatchShape(b, b, b, b * ctx, b * ctx))
    return out


def _time(shape: BatchShape, coef: tuple[float, ...], rng: random.Random,
          noise: float = 0.001) -> float:
    t = sum(c * x for c, x in zip(coef, op_features(shape), strict=True))
    return t * (1 + rng.gauss(0, noise))


def _close(got: tuple[float, ...], want: tuple[float, ...], rel: float) -> None:
    scale = [abs(w) for w in want]
    for g, w, s in zip(got, want, scale, strict=True):
        assert g == pytest.approx(w, rel=rel, abs=1e-3 * max(scale) if s == 0 else 0)


def test_batch_fit_recovers_known_coefficients() -> None:
    rng = random.Random(1)
    shapes = _shapes(200)
    est = Estimators({"cpu:0": "cpu"})
    fitted = est.fit_op("cpu", "layers[0:5]", shapes, [_time(s, TRUE_LAYERS, rng) for s in shapes])
    _close(fitted.coef, TRUE_LAYERS, rel=0.05)
    s = shapes[0]
    assert est.op_time("cpu:0", "layers[0:5]", s) == pytest.approx(
        sum(c * x for c, x in zip(TRUE_LAYERS, op_features(s), strict=True)), rel=0.01)


def test_rls_learns_online_and_tracks_mape() -> None:
    rng = random.Random(2)
    est = Estimators({"cpu:0": "cpu"})
    shapes = _shapes(400, seed=3)
    for s in shapes[:200]:
        est.observe_op("cpu:0", "layers[0:5]", s, _time(s, TRUE_LAYERS, rng))
    early = est.mape()["cpu/layers[0:5]"]
    est.reset_errors()
    for s in shapes[200:]:
        est.observe_op("cpu:0", "layers[0:5]", s, _time(s, TRUE_LAYERS, rng))
    late = est.mape()["cpu/layers[0:5]"]
    assert late < 0.01 < early  # the first predictions (from nothing) were far off
    _close(est.ops[("cpu", "layers[0:5]")].coef, TRUE_LAYERS, rel=0.1)


def test_rls_tracks_a_slowdown() -> None:
    rng = random.Random(4)
    shapes = _shapes(1100, seed=5)
    est = Estimators({"cpu:0": "cpu"})  # forgetting 0.998: ~500 samples of memory
    est.fit_op("cpu", "layers[0:5]", shapes[:100], [_time(s, TRUE_LAYERS, rng)
                                                    for s in shapes[:100]])
    slower = tuple(1.5 * c for c in TRUE_LAYERS)
    for s in shapes[100:]:
        est.observe_op("cpu:0", "layers[0:5]", s, _time(s, slower, rng))
    probe = shapes[0]
    assert est.op_time("cpu:0", "layers[0:5]", probe) == pytest.approx(
        _time(probe, slower, rng, noise=0), rel=0.05)


def test_freeze_scores_without_learning() -> None:
    rng = random.Random(6)
    shapes = _shapes(50, seed=7)
    est = Estimators({"cpu:0": "cpu"})
    est.fit_op("cpu", "head", shapes, [1e-3 + 1e-4 * s.num_sampled for s in shapes])
    before = est.ops[("cpu", "head")].coef
    est.freeze()
    ape = est.observe_op("cpu:0", "head", shapes[0], 1.0)
    assert est.ops[("cpu", "head")].coef == before and ape > 0.9
    assert est.mape() == {"cpu/head": ape}
    est.unfreeze()
    est.observe_op("cpu:0", "head", shapes[0], _time(shapes[0], before, rng))
    assert est.ops[("cpu", "head")].num_obs == 2


def test_cpu_devices_share_a_kind_and_unseen_groups_start_from_seen_ones() -> None:
    rng = random.Random(8)
    shapes = _shapes(100, seed=9)
    est = Estimators({"cuda:0": "NVIDIA H200"})
    est.fit_op("cpu", "layers[0:2]", shapes, [_time(s, TRUE_LAYERS, rng) for s in shapes])
    s = shapes[1]
    base = est.op_time("cpu:0", "layers[0:2]", s)
    assert est.op_time("cpu:1", "layers[0:2]", s) == base
    assert est.op_time("cpu:3", "layers[2:4]", s) == base  # same size: same cost
    assert est.op_time("cpu:0", "layers[4:5]", s) == pytest.approx(base / 2)
    assert est.kind_of("cpu:7") == "cpu" and est.kind_of("cuda:0") == "NVIDIA H200"
    with pytest.raises(KeyError):
        est.op_time("cuda:0", "layers[0:2]", s)  # that kind was never profiled
    with pytest.raises(KeyError):
        est.op_time("cpu:0", "embed", s)


def _done(op: OpInstance, seconds: float) -> OpInstance:
    op.state, op.start, op.end = OpState.DONE, 10.0, 10.0 + seconds
    return op


def test_transfers_fall_back_to_their_kind_pair_and_observe_routes_by_role() -> None:
    rng = random.Random(10)
    sizes = [rng.randint(1_000, 5_000_000) for _ in range(40)]
    est = Estimators()
    est.fit_transfer("cpu", "cpu", sizes, [TRUE_XFER[0] * b + TRUE_XFER[1] for b in sizes])
    assert est.transfer_time("cpu:0", "cpu:1", 1_000_000) == pytest.approx(
        TRUE_XFER[0] * 1e6 + TRUE_XFER[1], rel=1e-3)
    shape = BatchShape(8, 1, 1, 64, 8)
    recv = OpInstance(1, "recv", OpRole.RECV, -1, "cpu:1", Priority.HIGH, shape, ("r",),
                      transfer_bytes=1_000_000)
    send = OpInstance(2, "send", OpRole.SEND, -1, "cpu:0", Priority.HIGH, shape, ("r",),
                      peer=recv, transfer_bytes=1_000_000)
    assert est.estimate(send) == est.transfer_time("cpu:0", "cpu:1", 1_000_000)
    assert est.observe(_done(recv, 1e-6)) is None
    assert est.observe(_done(send, 3e-5)) == pytest.approx(abs(21.5e-6 - 3e-5) / 3e-5, rel=1e-3)
    assert ("cpu:0", "cpu:1") in est.transfers  # the exact pair now refits on its own
    assert "transfer cpu:0->cpu:1" in est.mape()
    failed = OpInstance(3, "embed", OpRole.COMPUTE, 0, "cpu:0", Priority.LOW, shape, ("r",))
    failed.state = OpState.FAILED
    assert est.observe(failed) is None


def test_json_round_trip_keeps_predictions_and_errors() -> None:
    rng = random.Random(11)
    shapes = _shapes(60, seed=12)
    est = Estimators()
    est.fit_op("cpu", "layers[0:2]", shapes, [_time(s, TRUE_LAYERS, rng) for s in shapes])
    est.fit_transfer("cpu", "cpu", [10, 10_000, 1_000_000], [1e-6, 2e-6, 2e-5])
    est.observe_op("cpu:0", "layers[0:2]", shapes[0], 0.01)
    est.meta = {"model": "x"}
    back = Estimators.from_json(est.to_json())
    for s in shapes:
        assert back.op_time("cpu:1", "layers[0:2]", s) == est.op_time("cpu:1", "layers[0:2]", s)
    assert back.transfer_time("cpu:0", "cpu:2", 5000) == est.transfer_time("cpu:0", "cpu:2", 5000)
    assert back.mape() == est.mape() and back.meta == {"model": "x"}


SMALL = Sweep(prefill_tokens=(4, 12), chunks=((4, 8),), decode_batches=(1, 3),
              decode_contexts=(8, 24), transfer_tokens=(1, 8, 32), repeats=1)


def test_profile_is_cached_on_disk(tiny_model_dir: Path, tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    model = load(tiny_model_dir, dtype="float32", layers_per_group=2)
    sweep = Sweep(prefill_tokens=(4, 12), chunks=((4, 8),), decode_batches=(1, 3),
                  decode_contexts=(8, 24), transfer_tokens=(1, 8, 32), repeats=1)
    calls: list[int] = []
    real = profiling.profile

    def counting(*a: object, **kw: object) -> Estimators:
        calls.append(1)
        return real(*a, **kw)  # type: ignore[arg-type]
    monkeypatch.setattr(profiling, "profile", counting)
    first = load_or_profile(model, ["cpu:0", "cpu:1"], tmp_path, sweep)
    again = load_or_profile(model, ["cpu:0", "cpu:1"], tmp_path, sweep)
    assert len(calls) == 1 and len(list((tmp_path / "estimators").glob("*.json"))) == 1
    shape = BatchShape(5, 1, 1, 25, 5)
    for t in model.template.ops:
        assert again.op_time("cpu:1", t.name, shape) == first.op_time("cpu:0", t.name, shape) > 0
    assert again.transfer_time("cpu:1", "cpu:0", 4096) == first.transfer_time("cpu:0", "cpu:1",
                                                                               4096) > 0
    load_or_profile(model, ["cpu:0", "cpu:1"], tmp_path, sweep, refresh=True)
    other = load(tiny_model_dir, dtype="float32", layers_per_group=1)
    load_or_profile(other, ["cpu:0", "cpu:1"], tmp_path, sweep)
    assert len(calls) == 3 and len(list((tmp_path / "estimators").glob("*.json"))) == 2


def test_a_one_device_fit_is_never_read_back_for_two_devices(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    model = load(tiny_model_dir, dtype="float32", layers_per_group=2)
    one = load_or_profile(model, ["cpu:0"], tmp_path, SMALL)
    assert not one.transfers
    two = load_or_profile(model, ["cpu:0", "cpu:1"], tmp_path, SMALL)
    assert ("cpu", "cpu") in two.transfers and not two.missing_pairs
    assert len(list((tmp_path / "estimators").glob("*.json"))) == 2


def test_an_unprofiled_pair_is_priced_by_the_fallback_and_handed_out_once() -> None:
    est = Estimators({"cpu:0": "cpu", "cpu:1": "cpu"})
    est.copy_bandwidth_bytes_s = 8e9  # the fallback assumes a quarter of it
    t = est.transfer_time("cpu:0", "cpu:1", 2_000_000)
    assert t == pytest.approx(2_000_000 / 2e9 + 1e-4)
    assert est.take_pairs_to_profile() == [("cpu:0", "cpu:1")]
    est.transfer_time("cpu:0", "cpu:1", 10)
    assert est.take_pairs_to_profile() == []
    est.fit_transfer("cpu:0", "cpu:1", [10, 10_000, 1_000_000], [1e-6, 2e-6, 2e-5])
    assert est.transfer_time("cpu:0", "cpu:1", 1_000_000) == pytest.approx(2e-5, rel=0.05)


def test_an_unprofiled_device_kind_gets_the_flop_fallback_and_learns_from_it(
        tiny_model_dir: Path) -> None:
    model = load(tiny_model_dir, dtype="float32", layers_per_group=2)
    est = Estimators({"cuda:0": "Some GPU"})
    shape = BatchShape(64, 1, 1, 64 * 64, 64)
    with pytest.raises(KeyError):
        est.op_time("cuda:0", "layers[0:2]", shape)
    est.fallback_op = profiling.fallback_coefficients(model.template, 1e9, flops_per_s=1e10)
    layers = model.template.ops[1]
    want = layers.flops(shape) / 1e10 + (layers.weight_bytes + 64 * layers.kv_bytes_per_token) / 1e9
    assert est.op_time("cuda:0", "layers[0:2]", shape) == pytest.approx(want, rel=1e-6)
    assert est.missing_ops == {("Some GPU", "layers[0:2]")}
    for _ in range(50):
        est.observe_op("cuda:0", "layers[0:2]", shape, 0.5 * want)
    assert est.op_time("cuda:0", "layers[0:2]", shape) == pytest.approx(0.5 * want, rel=0.05)


def test_a_fit_is_never_read_back_for_other_kernels(tiny_model_dir: Path, tmp_path: Path) -> None:
    portable = load(tiny_model_dir, dtype="float32", layers_per_group=2, kernel_choice=PORTABLE)
    other = load(tiny_model_dir, dtype="float32", layers_per_group=2,
                 kernel_choice=KernelChoice(layer=LayerChoice(decode="matmul")))
    load_or_profile(portable, ["cpu:0"], tmp_path, SMALL)
    load_or_profile(other, ["cpu:0"], tmp_path, SMALL)
    assert len(list((tmp_path / "estimators").glob("*.json"))) == 2


def _watched(seed: int) -> tuple[Estimators, list[str], random.Random]:
    rng = random.Random(seed)
    shapes = _shapes(80, seed=seed)
    est = Estimators({"cpu:0": "cpu"})
    est.fit_op("cpu", "layers[0:5]", shapes, [_time(s, TRUE_LAYERS, rng) for s in shapes])
    fired: list[str] = []
    est.on_drift = fired.append
    return est, fired, rng


@pytest.mark.parametrize("seed", range(3))
def test_noise_and_outliers_never_trigger_a_reprofile(seed: int) -> None:
    est, fired, rng = _watched(seed)
    for k, s in enumerate(_shapes(3000, seed=seed + 10)):
        t = _time(s, TRUE_LAYERS, rng, noise=0.15)  # a noisy host: CoV 15%
        if k % 10 == 0:
            t *= rng.choice([3.0, 0.3])
        est.observe_op("cpu:0", "layers[0:5]", s, t, at=0.05 * k)
    assert fired == []
    assert abs(est.ops[("cpu", "layers[0:5]")].level - 1) < 0.05


def test_drift_triggers_a_reprofile_once_per_cooldown() -> None:
    est, fired, rng = _watched(20)
    slower = tuple(1.3 * c for c in TRUE_LAYERS)
    shapes = _shapes(3000, seed=21)
    for k, s in enumerate(shapes[:100]):  # still as profiled
        est.observe_op("cpu:0", "layers[0:5]", s, _time(s, TRUE_LAYERS, rng, 0.05), at=0.1 * k)
    assert fired == []
    for k, s in enumerate(shapes[100:180]):  # 30% slower from t = 10 s on
        est.observe_op("cpu:0", "layers[0:5]", s, _time(s, slower, rng, 0.05), at=10 + 0.1 * k)
    assert fired == ["cpu"]  # once a full window backs it
    for k, s in enumerate(shapes[180:2000]):  # it persists: again after the cooldown (300 s)
        est.observe_op("cpu:0", "layers[0:5]", s, _time(s, slower, rng, 0.05), at=18 + 0.2 * k)
    assert fired == ["cpu", "cpu"]  # at ~310 s; the next one waits 600 s more
    assert est.drift.fired == ["cpu", "cpu"]


def test_a_drift_of_microseconds_re_profiles_nothing() -> None:
    rng = random.Random(30)
    tiny = (1e-8, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 3.5e-5)  # an embedding: ~35 us whatever the shape
    shapes = _shapes(400, seed=31)
    est = Estimators({"cpu:0": "cpu"})
    est.fit_op("cpu", "embed", shapes[:80], [_time(s, tiny, rng) for s in shapes[:80]])
    fired: list[str] = []
    est.on_drift = fired.append
    for k, s in enumerate(shapes[80:]):  # 1.5x its profile: Python overhead, 18 us an op
        est.observe_op("cpu:0", "embed", s, 1.5 * _time(s, tiny, rng), at=0.1 * k)
    assert abs(est.ops[("cpu", "embed")].level - 1.5) < 0.05  # the drift is seen ...
    assert fired == []  # ... and moves no prediction by enough to re-profile


def test_batches_within_the_native_rows_are_priced_on_their_own_line() -> None:
    # NOTE: up to `native_rows` rows (here 4) the CPU kernels run a GEMV: its rows cost
    # their own slope (native_rows), and the gemm_rows step starts above them
    coef = (8e-5, 1.6e-7, 2e-5, 0.0, 3e-7, 4e-4, 1.5e-3, 3e-3)

    def true(s: BatchShape) -> float:
        return sum(c * x for c, x in zip(coef, op_features(s, 4), strict=True))

    native = [BatchShape(b, b, b, b * ctx, b * ctx) for b in (1, 2, 4) for ctx in (32, 256)]
    shapes = [*_shapes(200, seed=3), *native]
    est = Estimators({"cpu:0": "cpu"})
    est.native_rows = 4
    est.fit_op("cpu", "layers[0:5]", shapes, [true(s) for s in shapes])
    three, five = BatchShape(3, 3, 3, 3 * 64, 3 * 64), BatchShape(5, 5, 5, 5 * 64, 5 * 64)
    for s in (three, five):
        assert est.op_time("cpu:0", "layers[0:5]", s) == pytest.approx(true(s), rel=0.01)
    again = Estimators.from_json(est.to_json())
    assert again.native_rows == 4
    assert again.op_time("cpu:0", "layers[0:5]", three) == est.op_time("cpu:0", "layers[0:5]",
                                                                       three)


def test_verify_steps_are_priced_on_the_native_line_within_the_invariant_rows() -> None:
    # NOTE: a verify step's decode rows run the GEMV a one-row step runs, whatever
    # `native_rows` (models.batch.Batch.row_invariant); a prefill of as many rows does not
    verify = _step(6, 1, 6)  # one request: its token and 5 drafts
    shared = _step(8, 3, 8)  # with two plain decode rows
    prefill = _step(6, 1, 1)
    too_many = _step(INVARIANT_ROWS + 1, 1, INVARIANT_ROWS + 1)
    assert runs_native(verify, 2) and runs_native(shared, 2)
    assert not runs_native(prefill, 2) and not runs_native(too_many, 2)
    assert not runs_native(verify, 0)  # no native GEMV at all: the GEMMs run it
    coef = (8e-5, 1.6e-7, 2e-5, 0.0, 3e-7, 4e-4, 1.5e-3, 3e-3)
    est = Estimators({"cpu:0": "cpu"})
    est.native_rows = 2
    est.fit_op("cpu", "layers[0:5]", *_fitted(coef, 2))
    for s in (verify, prefill):
        want = sum(c * x for c, x in zip(coef, op_features(s, 2), strict=True))
        assert est.op_time("cpu:0", "layers[0:5]", s) == pytest.approx(want, rel=0.01)


def _step(tokens: int, seqs: int, sampled: int, ctx: int = 300) -> BatchShape:
    return BatchShape(num_tokens=tokens, num_seqs=seqs, num_sampled=sampled,
                      attn_work=tokens * ctx, num_context_tokens=seqs * ctx)


def _fitted(coef: tuple[float, ...], rows: int) -> tuple[list[BatchShape], list[float]]:
    shapes = [*_shapes(200, seed=5), *(_step(t, 1, t, c) for t in (2, 4, 6) for c in (64, 300)),
              *(_step(b, b, b, c) for b in (1, 2) for c in (32, 256))]
    return shapes, [sum(c * x for c, x in zip(coef, op_features(s, rows), strict=True))
                    for s in shapes]


def test_a_wide_op_and_a_hold_teach_no_estimator() -> None:
    est = Estimators({"cpu:0": "cpu", "cpu:1": "cpu"})
    shape = BatchShape(64, 1, 1, 64 * 64, 64)
    est.fit_op("cpu", "head", [shape, BatchShape(8, 1, 1, 64, 8)], [0.01, 0.002])
    before = est.op_time("cpu:0", "head", shape)
    hold = OpInstance(1, "hold", OpRole.HOLD, -1, "cpu:1", Priority.HIGH, shape, ("r",))
    op = OpInstance(2, "head", OpRole.COMPUTE, 2, "cpu:0", Priority.HIGH, shape, ("r",),
                    wide=hold)
    for o in (hold, op):
        o.state, o.start, o.end = OpState.DONE, 0.0, 0.5
        assert est.observe(o) is None
    assert est.op_time("cpu:0", "head", shape) == before and est.mape() == {}
