"""The wide factor (scheduler/cost/wide.py): timed where two CPU devices share this host,
cached with the fit, absent on one device or where the sweep does not measure it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from models.loader import load
from scheduler.cost.profiling import Sweep, load_or_profile

SMALL = Sweep(prefill_tokens=(4, 12), chunks=((4, 8),), decode_batches=(1, 3),
              decode_contexts=(8, 24), transfer_tokens=(1, 8, 32), repeats=1)


def test_the_wide_factor_is_timed_on_two_cpu_devices_and_cached(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    model = load(tiny_model_dir, dtype="float32", layers_per_group=2)
    wide = dataclasses.replace(SMALL, wide_tokens=64, wide_repeats=2)
    two = load_or_profile(model, ["cpu:0", "cpu:1"], tmp_path, wide)
    assert two.wide_factor is not None and 0.1 < two.wide_factor < 10
    back = load_or_profile(model, ["cpu:0", "cpu:1"], tmp_path, wide)
    assert back.wide_factor == two.wide_factor
    assert load_or_profile(model, ["cpu:0"], tmp_path, wide).wide_factor is None
    off = dataclasses.replace(wide, wide_repeats=0)
    assert load_or_profile(model, ["cpu:0", "cpu:1"], tmp_path, off).wide_factor is None

