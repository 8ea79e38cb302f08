"""`python -m loadgen bursts`: TTFT by the arrivals just before, and token gaps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadgen.__main__ import main
from loadgen.bursts import burst_sizes, summarize


def _row(send: float, ttft: float, gaps: list[float]) -> dict:
    tokens, t = [send + ttft], send + ttft
    for g in gaps:
        t += g
        tokens.append(t)
    return {"send_s": send, "first_token_s": send + ttft, "token_s": tokens}


def test_burst_sizes_count_the_requests_of_the_second_up_to_each() -> None:
    assert burst_sizes([0.0, 0.5, 0.9, 2.0, 2.95]) == [1, 2, 3, 1, 2]
    assert burst_sizes([1.0, 0.0, 0.5]) == [2, 1, 2]  # any order; the window is (t - 1, t]


def test_summarize_groups_ttft_by_burst_and_collects_every_gap() -> None:
    rows = [_row(0.0, 0.05, [0.02]), *(_row(5 + 0.1 * i, 0.3, [0.1, 0.2]) for i in range(5))]
    s = summarize(rows)
    # the lone request and the burst's first one arrive with nothing in the second before
    assert s["by_burst"]["1"] == {"requests": 2, "ttft_p50_ms": pytest.approx(175),
                                  "ttft_max_ms": pytest.approx(300)}
    assert s["by_burst"]["2"]["requests"] == 1 and s["by_burst"]["3-4"]["requests"] == 2
    assert s["by_burst"]["5+"]["requests"] == 1
    assert s["by_burst"]["5+"]["ttft_p50_ms"] == pytest.approx(300)
    assert s["gap_ms"]["p50"] == pytest.approx(100)  # gaps 20, 100 x5, 200 x5


def test_the_command_prints_a_row_per_run_and_refuses_other_folders(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "bench" / "runs" / "slice"
    run.mkdir(parents=True)
    failed = {"send_s": 1.0, "first_token_s": None, "token_s": []}
    rows = [_row(0.0, 0.05, [0.02]), failed]
    (run / "requests.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert main(["bursts", str(run)]) == 0
    out = capsys.readouterr().out
    assert "| bench/slice | 50 (1) |" in out
    assert main(["bursts", str(tmp_path)]) == 2
    assert "no requests.jsonl" in capsys.readouterr().err
