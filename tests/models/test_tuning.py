"""The start-up kernel choice: measured once, recorded on disk, reused, remeasured on change."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import models
from models import native, probes, tuning
from models.choices import PORTABLE, GemmChoice, KernelChoice
from models.cpu import parse_cpuinfo
from models.linear import onednn_available
from models.loader import layer_weights

needs_native = pytest.mark.skipif(native.library() is None,
                                  reason="the native kernels need a C compiler here")

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Some Xeon
flags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_tile amx_bf16

processor\t: 1
model name\t: Some Xeon
flags\t\t: fpu
"""


def test_capability_line_from_cpuinfo() -> None:
    caps = parse_cpuinfo(CPUINFO, 2, "AVX512")
    assert (caps.amx, caps.avx512_bf16, caps.avx512, caps.avx2) == (True, True, True, True)
    assert caps.line().startswith("Some Xeon, 2 CPUs: AMX yes, AVX512-BF16 yes, AVX512 yes")
    bare = parse_cpuinfo("model name : Old\nflags : sse avx2\n", 1, "AVX2")
    assert (bare.amx, bare.avx512_bf16, bare.avx512, bare.avx2) == (False, False, False, True)


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SLICEGATE_CACHE", str(tmp_path))
    return tmp_path


def _count_measures(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = tuning.measure

    def counting(*args: object, **kwargs: object) -> tuning.Tuned:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]
    monkeypatch.setattr(tuning, "measure", counting)
    return calls


def test_choice_is_recorded_then_reused(tiny_model_dir: Path, cache: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count_measures(monkeypatch)
    first = models.load(tiny_model_dir, dtype="bfloat16")
    files = list((cache / "kernels").glob("*.json"))
    assert len(calls) == 1 and len(files) == 1
    record = json.loads(files[0].read_text())
    assert KernelChoice.from_dict(record["choice"]) == first.kernels
    assert record["timings_ms"]["gemm"]
    assert record["cpu"].startswith(record["key"]["cpu"]["model_name"])
    assert record["native"] == native.note()  # how the native kernels were built, or why not
    assert record["key"]["native"] == native.build_id()  # another build measures again
    assert bool(record["key"]["native"]) == (native.library() is not None)
    again = models.load(tiny_model_dir, dtype="bfloat16")
    assert len(calls) == 1 and again.kernels == first.kernels  # read back, not measured
    models.load(tiny_model_dir, dtype="bfloat16", retune=True)
    assert len(calls) == 2


def test_another_dtype_or_thread_count_is_measured_apart(tiny_model_dir: Path, cache: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count_measures(monkeypatch)
    models.load(tiny_model_dir, dtype="bfloat16")
    models.load(tiny_model_dir, dtype="float32")
    models.load(tiny_model_dir, dtype="float32", threads=2)
    assert len(calls) == 3 and len(list((cache / "kernels").glob("*.json"))) == 3


def test_a_damaged_or_stale_record_is_measured_again(tiny_model_dir: Path, cache: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    model = models.load(tiny_model_dir, dtype="float32", kernel_choice=PORTABLE)
    args = (layer_weights(model.ops), model.config, model.dtype)
    path = tuning.cache_path(tuning.tuning_key(*args[1:], threads=1))
    tuning.load_or_measure(*args)
    calls = _count_measures(monkeypatch)
    path.write_text("{not json")
    assert not tuning.load_or_measure(*args).from_cache
    record = json.loads(path.read_text())
    record["key"]["torch"] = "0.0"  # measured under another torch
    path.write_text(json.dumps(record))
    assert not tuning.load_or_measure(*args).from_cache
    assert tuning.load_or_measure(*args).from_cache and len(calls) == 2


def test_a_forced_choice_measures_nothing(tiny_model_dir: Path, cache: Path) -> None:
    model = models.load(tiny_model_dir, dtype="float32", kernel_choice=PORTABLE)
    assert model.kernels == PORTABLE and not (cache / "kernels").exists()


@pytest.mark.skipif(not onednn_available(torch.bfloat16), reason="no oneDNN bf16 here")
def test_a_choice_is_not_read_back_once_onednn_is_held_back(tiny_model_dir: Path,
                                                            tmp_path: Path) -> None:
    code = ("import models; "
            f"print(models.load({str(tiny_model_dir)!r}, dtype='bfloat16').kernels.gemm.backend)")

    def load(**env: str) -> str:
        full = {**os.environ, "SLICEGATE_CACHE": str(tmp_path), **env}
        return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True,
                              text=True, timeout=300, check=True).stdout.strip()
    load()
    assert load(ONEDNN_MAX_CPU_ISA="AVX2") == "aten"  # no bf16 oneDNN there: measured again
    assert len(list((tmp_path / "kernels").glob("*.json"))) == 2


def test_a_cache_that_cannot_be_written_costs_a_measurement_not_the_load(
        tiny_model_dir: Path, cache: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    (cache / "kernels").write_text("a file where the folder should be")
    calls = _count_measures(monkeypatch)
    models.load(tiny_model_dir, dtype="float32")
    models.load(tiny_model_dir, dtype="float32")
    assert len(calls) == 2 and "kernel choice not cached" in caplog.text


def test_rows_are_padded_only_where_a_first_run_costs_more_than_padding() -> None:
    jit = {41: {"first": 6.0, "exact": 0.7, "padded": 0.6},
           105: {"first": 8.8, "exact": 1.0, "padded": 1.0},
           217: {"first": 15.7, "exact": 1.6, "padded": 1.5}}
    assert probes.pad_rule(jit) == probes.PAD
    cheap = {r: {**m, "first": m["exact"] * 1.05, "padded": m["exact"] * 1.2}
             for r, m in jit.items()}
    assert probes.pad_rule(cheap) == 0


def _measured(folder: Path, cache: Path) -> tuple[models.Model, dict]:
    """A float32 load of `folder` that measured its kernels, and the record it wrote."""
    model = models.load(folder, dtype="float32")
    return model, json.loads(next((cache / "kernels").glob("*.json")).read_text())


def test_the_padding_probe_is_recorded_with_its_choice(tiny_model_dir: Path, cache: Path) -> None:
    model, record = _measured(tiny_model_dir, cache)
    probed = record["timings_ms"]["pad_rows"]
    assert sorted(int(r) for r in probed) == sorted(probes.PAD_PROBE_ROWS)
    assert all(set(m) == {"first", "exact", "padded"} for m in probed.values())
    assert model.kernels.layer.pad_rows == probes.pad_rule(
        {int(r): m for r, m in probed.items()})


def test_a_half_precision_model_times_its_gemms_on_float32_weights_too(
        tiny_model_dir: Path, cache: Path) -> None:
    model = models.load(tiny_model_dir, dtype="bfloat16")
    record = json.loads(next((cache / "kernels").glob("*.json")).read_text())
    gemm = record["timings_ms"]["gemm"]
    backends = {c.name: c for c in probes.gemm_candidates(torch.bfloat16)}
    assert "aten" in backends and "aten+fp32" in backends and backends.keys() <= gemm.keys()
    rows = [str(r) for r in probes.GEMM_ROWS]
    best = {r: min(gemm[b][r] for b in backends) for r in rows}
    score = {b: sum(gemm[b][r] / best[r] for r in rows) for b in backends}
    chosen = model.kernels.gemm
    assert backends[min(score, key=lambda b: score[b])].upcast == chosen.upcast  # by the timings
    fp32 = models.load(tiny_model_dir, dtype="float32")
    assert not fp32.kernels.gemm.upcast  # float32 has nothing to cast up


def test_gemm_choice_names_its_float32_weights() -> None:
    choice = GemmChoice("onednn", 16, native_rows=4, upcast=True, half_rows=2)
    assert choice.name == "onednn@16+fp32+half<=2+native<=4" and choice.few_rows == 4
    assert KernelChoice.from_dict(KernelChoice(choice).to_dict()).gemm == choice


def test_few_row_paths_are_chosen_by_their_summed_times() -> None:
    tie_then_wins = {"fast": {1: 49.6, 2: 42.0, 4: 50.0, 8: 300.0},
                     "base": {1: 48.8, 2: 69.2, 4: 117.3, 8: 150.0}}
    assert probes.rows_rule(tie_then_wins) == 4  # 1 + 2 + 4: 141.6 < 235.3; with 8 it is not
    assert probes.rows_rule({"fast": {1: 2.0, 2: 3.0}, "base": {1: 1.0, 2: 2.0}}) == 0
    # the kernel record of an AVX2-only machine: ahead on the sum at 8 rows, 2.4x slower there
    carried = {"fast": {1: 12.4, 2: 12.7, 4: 26.7, 8: 131.7},
               "base": {1: 16.8, 2: 29.3, 4: 86.6, 8: 55.9}}
    assert probes.rows_rule(carried) == 4


@needs_native
def test_the_gemv_prefetch_level_is_measured_and_recorded(tiny_model_dir: Path,
                                                          cache: Path) -> None:
    model, record = _measured(tiny_model_dir, cache)
    gemm = record["timings_ms"]["gemm"]
    timed = {pf: gemm[f"native@{pf}"] for pf in ("l1", "l2")}
    assert all(sorted(int(r) for r in t) == list(probes.PREFETCH_ROWS) for t in timed.values())
    faster = min(timed, key=lambda pf: sum(timed[pf].values()))
    assert model.kernels.gemm.prefetch == faster  # the GEMV runs the faster level
    assert record["choice"]["gemm"]["prefetch"] == model.kernels.gemm.prefetch


def test_gemm_choice_names_its_prefetch_level() -> None:
    choice = GemmChoice("onednn", 16, native_rows=2, prefetch="l2")
    assert choice.name == "onednn@16+native<=2@l2"
    assert KernelChoice.from_dict(KernelChoice(choice).to_dict()).gemm == choice
    assert GemmChoice("onednn", 16, prefetch="l2").name == "onednn@16"  # no GEMV, no level
    with pytest.raises(ValueError, match="prefetch"):
        GemmChoice(prefetch="l3")


@needs_native
def test_the_prefill_attention_kernel_is_measured_and_recorded(tiny_model_dir: Path,
                                                                cache: Path) -> None:
    model, record = _measured(tiny_model_dir, cache)
    timed = record["timings_ms"]["prefill_attention"]
    assert sorted(int(n) for n in timed) == list(probes.PREFILL_SIZES)
    assert all(set(m) == {"matmul", "sdpa", "native"} for m in timed.values())  # fp32: no AMX
    total = {k: sum(m[k] for m in timed.values()) for k in ("sdpa", "native")}
    assert model.kernels.layer.prefill == min(total, key=lambda k: total[k])
    assert record["choice"]["layer"]["prefill"] == model.kernels.layer.prefill


@pytest.mark.skipif(not native.amx_ready(), reason="this CPU lacks AMX-BF16")
def test_a_bf16_load_times_the_amx_prefill_kernel_too(tiny_model_dir: Path, cache: Path) -> None:
    model = models.load(tiny_model_dir, dtype="bfloat16")
    record = json.loads(next((cache / "kernels").glob("*.json")).read_text())
    timed = record["timings_ms"]["prefill_attention"]
    assert all(set(m) == {"matmul", "sdpa", "native", "amx"} for m in timed.values())
    total = {k: sum(m[k] for m in timed.values()) for k in ("sdpa", "native", "amx")}
    assert model.kernels.layer.prefill == min(total, key=lambda k: total[k])


@needs_native
def test_the_whole_native_layer_is_timed_within_the_rows_of_the_model_dtype_copy(
        tiny_model_dir: Path, cache: Path) -> None:
    model = models.load(tiny_model_dir, dtype="bfloat16", kernel_choice=PORTABLE)
    layers, cfg, lay = layer_weights(model.ops), model.config, PORTABLE.layer
    up = GemmChoice("aten", native_rows=4, upcast=True, half_rows=2)
    _, ms = probes.measure_decode_layer(layers, cfg, torch.bfloat16, up, lay, 1)
    assert sorted(ms) == [1, 2] and all(set(m) == {"ops", "native"} for m in ms.values())
    bare = GemmChoice("aten", native_rows=4, upcast=True)  # the float32 weights only: no call
    assert probes.measure_decode_layer(layers, cfg, torch.bfloat16, bare, lay, 1) == ("ops", {})
