"""Requests timed through the operator chain alone (`timed_request`, `python -m models direct`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import models
from models.generate import timed_request


def test_timed_request_first_token_then_the_rest(tiny_model_dir: Path) -> None:
    model = models.load(tiny_model_dir, dtype="float32")
    first, total = timed_request(model, [1, 2, 3, 4, 5], max_tokens=4)
    assert 0 < first < total
    one_first, one_total = timed_request(model, [1, 2, 3], max_tokens=1)
    assert 0 < one_first <= one_total


def test_direct_cli_times_each_case(tiny_model_dir: Path, tmp_path: Path) -> None:
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps([{"prompt": "hello world", "max_tokens": 1, "case": [2, 1]},
                                 {"prompt": "a longer prompt here", "max_tokens": 3}]))
    out = subprocess.run([sys.executable, "-m", "models", "direct", "--model",
                          str(tiny_model_dir), "--dtype", "float32", "--cases", str(cases),
                          "--repeats", "2"], check=True, capture_output=True, text=True,
                         timeout=300)
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["dtype"] == "torch.float32" and doc["threads"] == 1 and "GEMM" in doc["kernels"]
    first, second = doc["cases"]
    assert first["case"] == [2, 1] and first["prompt_tokens"] > 0
    for c in (first, second):
        assert len(c["ttft_s"]) == len(c["total_s"]) == 2
        assert all(0 < t <= total for t, total in zip(c["ttft_s"], c["total_s"], strict=True))
        assert c["median_ttft_s"] <= c["median_total_s"]
