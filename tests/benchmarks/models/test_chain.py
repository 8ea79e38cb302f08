"""`python -m benchmarks.models chain` on a tiny model: every case, its floor, the goals, JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.models import chain


def test_bench_rows_floors_and_goals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "models.json"
    result = chain.run("tiny-random", ["bfloat16"], repeats=1, threads=1, json_path=out)
    cases = [r["case"] for r in result["rows"]]
    assert cases == [f"prefill {n}" for n in chain.PREFILLS] + [
        f"decode b={b}" for b in chain.DECODE_BATCHES]
    for r in result["rows"]:
        assert r["ours_s"] > 0 and r["hf_s"] > 0 and r["floor_s"] > 0
        native = [f"native@{pf}{up}" for pf in ("l1", "l2") for up in ("", "+fp32")]
        assert r["floor_backend"] in ("aten", "onednn", "aten+fp32", "onednn+fp32", *native)
        # bf16: float32 copies timed too
    stream = result["per_dtype"]["bfloat16"]["stream"]
    assert stream["weight_bytes"] > 0 and stream["copy_bandwidth_bytes_s"] > 0
    goals = [g["goal"] for g in result["goals"]]
    assert "bfloat16 decode b=1: ours <= 1.5x weight streaming" in goals
    assert "bfloat16 prefill 16: ours <= 3.0x GEMM floor" in goals
    assert "bfloat16 prefill 512: ours <= 1.5x GEMM floor" in goals
    assert json.loads(out.read_text())["cpu"] == result["cpu"]
    printed = capsys.readouterr().out
    assert result["cpu"] in printed and "| bfloat16 | decode b=32 |" in printed
