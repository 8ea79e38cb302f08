"""`python -m benchmarks.scheduler overhead` with fewer requests than a block, and with nonsense."""

from __future__ import annotations

import pytest

from benchmarks.scheduler.overhead import main


def test_fewer_requests_than_one_block_still_measure(capsys: pytest.CaptureFixture[str]) -> None:
    result = main(["--model", "tiny-random", "--dtype", "float32", "--requests", "10"])
    rows = result["rows"]
    assert [r["requests"] for r in rows] == [10, 10]  # type: ignore[index]
    assert all(r["direct_s"] > 0 and r["scheduled_s"] > 0 for r in rows)  # type: ignore[union-attr]
    assert "| 1 | 10 |" in capsys.readouterr().out


def test_zero_requests_are_refused_with_a_message(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--requests", "0"])
    assert "--requests and --block must be >= 1" in capsys.readouterr().err
