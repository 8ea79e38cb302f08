"""`python -m benchmarks.models lora` on the tiny model: both batches timed, layouts, JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from benchmarks.models import lora
from benchmarks.models.lora_layouts import compare


def test_base_and_mixed_batches_are_timed(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "lora.json"
    threads = torch.get_num_threads()
    try:
        lora.main(["--model", "tiny-random", "--seqs", "5", "--adapters", "2", "--rank", "4",
                   "--targets", "q,v,down", "--context", "20", "--steps", "2", "--repeats", "2",
                   "--layouts", "--json", str(out)])
    finally:
        torch.set_num_threads(threads)
    result = json.loads(out.read_text())
    assert result["mixed_rows"] == ["lora0", "lora0", "lora1", "lora1", None]
    assert result["targets"] == ["q", "v", "down"] and result["adapter_mib"] > 0
    assert result["tok_s"]["base"] > 0 and result["tok_s"]["mixed"] > 0
    assert all(len(v) == 2 for v in result["times_s"].values())
    assert set(result["layouts_s"]) == {"masked", "grouped", "gathered"}
    assert "mixed / base:" in capsys.readouterr().out


def test_layouts_are_checked_against_a_per_row_reference() -> None:
    times = compare({"q": (16, 24), "down": (32, 16)}, rows=7, num_adapters=3, rank=2,
                    repeats=1)
    assert all(t > 0 for t in times.values())


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="--targets 'q,lm_head'"):
        lora.main(["--model", "tiny-random", "--targets", "q,lm_head"])
    with pytest.raises(ValueError, match="2 per adapter"):
        lora.main(["--model", "tiny-random", "--seqs", "3", "--adapters", "2"])
