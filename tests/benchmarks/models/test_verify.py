"""`python -m benchmarks.models verify` on the tiny model: every way timed, a table and JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.models.verify import ROWS, main


def test_a_verify_step_is_timed_row_invariant_beside_the_gemms(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]
                                                                ) -> None:
    out = tmp_path / "verify.json"
    rows = main(["--model", "tiny-random", "--dtype", "float32", "--repeats", "1",
                 "--json", str(out)])
    assert [r["rows"] for r in rows] == list(ROWS)
    for r in rows:
        for way in ("one row", "invariant", "gemm"):
            ms = r[way]
            assert isinstance(ms, dict) and ms["step"] >= ms["layers"] + ms["head"] > 0
    assert json.loads(out.read_text())["rows"][0]["rows"] == ROWS[0]
    assert "invariant / gemm" in capsys.readouterr().out
