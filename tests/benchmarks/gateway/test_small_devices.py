"""benchmarks.gateway.small_devices, and issue 41's goal with it: 32 chats without
`max_tokens` on `--device-memory-gib 0.6` all complete, most running at once, and leave
no KV block in use."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.gateway import small_devices


def test_32_chats_without_max_tokens_on_a_small_budget(default_model_dir: Path,
                                                       tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    out = small_devices.main(["--json", str(tmp_path / "out.json")])
    assert out.cap_logged and 16 < out.max_model_len < 8192  # the model's is 8192
    assert (out.completed, out.errors) == (32, 0)
    assert out.peak_running > 16  # most at once
    assert out.kv_blocks_used_after == 0
    assert out.completion_tokens >= 32
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["peak_running"] == out.peak_running and doc["config"]["chats"] == 32
    assert "| 32/32 |" in capsys.readouterr().out
