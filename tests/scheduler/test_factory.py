"""Device lists: one parser for the gateway's config and the benches; the scheduler built
with what its rounds need."""

from __future__ import annotations

from pathlib import Path

import pytest

from models.loader import load
from scheduler.config import SchedulerConfig
from scheduler.cost.profiling import Sweep, load_or_profile
from scheduler.factory import (
    build_scheduler,
    default_devices,
    device_names,
    parse_devices,
    wide_partners,
)
from scheduler.sim import native as simloop


def test_names_from_a_string_or_a_list() -> None:
    assert device_names(" cpu:0, cpu:1 ,") == ["cpu:0", "cpu:1"]
    assert device_names(["cuda:1", "cpu:0"]) == ["cuda:1", "cpu:0"]
    assert device_names(None) == default_devices()


@pytest.mark.parametrize(("spec", "problem"), [
    ("", "at least one device"),
    ([], "at least one device"),
    ("gpu:0", "'gpu:0' is not cuda:N or cpu:N"),
    ("cpu", "is not cuda:N"),
    ("cpu:0,cpu:0", "listed twice"),
])
def test_bad_lists_are_refused(spec: str | list[str], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        device_names(spec)


def test_each_device_gets_the_budget() -> None:
    devices = parse_devices("cpu:0,cpu:1", 1.5)
    assert [(d.name, d.memory_bytes) for d in devices] == [
        ("cpu:0", 3 * 2**29), ("cpu:1", 3 * 2**29)]


def test_the_simulators_c_loop_is_built_before_the_first_round(
        tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = load(tiny_model_dir, dtype="float32")
    est = load_or_profile(model, ["cpu:0"], tmp_path, Sweep(
        prefill_tokens=(4, 64), chunks=((32, 64),), decode_batches=(1,), decode_contexts=(8,),
        transfer_tokens=(1, 8), repeats=1))
    built: list[bool] = []
    monkeypatch.setattr(simloop, "library", lambda: built.append(True))
    build_scheduler(model, parse_devices("cpu:0", 0.25), SchedulerConfig(policy="slice"), est)
    assert built  # NOTE: a fresh cache's build (~0.4 s) would otherwise stall that round


def test_drift_re_profiles_a_kind_unless_turned_off(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    model = load(tiny_model_dir, dtype="float32")
    sweep = Sweep(prefill_tokens=(4, 64), chunks=((32, 64),), decode_batches=(1,),
                  decode_contexts=(8,), transfer_tokens=(1, 8), repeats=1)
    devices = parse_devices("cpu:0", 0.25)
    on = build_scheduler(model, devices, SchedulerConfig(policy="slice"),
                         load_or_profile(model, ["cpu:0"], tmp_path, sweep))
    assert on.estimator is not None and on.profiler is not None
    assert on.estimator.on_drift == on.profiler.request_kind
    off = build_scheduler(model, devices, SchedulerConfig(policy="slice", reprofile=False),
                          load_or_profile(model, ["cpu:0"], tmp_path, sweep))
    assert off.estimator is not None and off.estimator.on_drift is None


def test_wide_plans_are_offered_on_two_cpu_devices_with_a_profiled_factor_unless_off(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    model = load(tiny_model_dir, dtype="float32")
    sweep = Sweep(prefill_tokens=(4, 64), chunks=((32, 64),), decode_batches=(1,),
                  decode_contexts=(8,), transfer_tokens=(1, 8), repeats=1, wide_tokens=64,
                  wide_repeats=1)
    est = load_or_profile(model, ["cpu:0", "cpu:1"], tmp_path, sweep)
    devices = parse_devices("cpu:0,cpu:1", 0.25)
    on = build_scheduler(model, devices, SchedulerConfig(policy="slice"), est)
    assert on.builder.wide_factor == est.wide_factor is not None
    assert on.builder.partners == {"cpu:0": ("cpu:1",), "cpu:1": ("cpu:0",)}
    off = build_scheduler(model, devices, SchedulerConfig(policy="slice", wide_prefill=False),
                          est)
    assert off.builder.wide_factor is None and not off.builder.partners
    assert wide_partners(parse_devices("cpu:0", 0.25)) == {}
