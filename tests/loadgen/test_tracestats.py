"""Tests for loadgen.tracestats (summary figures, the table, the CLI)."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadgen.traces import SYNTHETIC_CODING, TraceRequest
from loadgen.tracestats import format_stats_table, main, trace_stats

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def _requests(*rows: tuple[float, int, int]) -> list[TraceRequest]:
    return [TraceRequest(*row) for row in rows]


def test_trace_stats() -> None:
    requests = _requests((0.0, 100, 10), (1.0, 200, 20), (3.0, 300, 30), (4.0, 400, 40))
    stats = trace_stats(requests)
    assert (stats.num_requests, stats.duration_s, stats.requests_per_s) == (4, 4.0, 1.0)
    assert stats.prompt_tokens_p50 == 250.0
    assert stats.prompt_tokens_p90 == pytest.approx(370.0)
    assert stats.output_tokens_p99 == pytest.approx(39.7)
    assert stats.output_tokens_mean == 25.0
    assert stats.interarrival_cov == pytest.approx(0.35355, rel=1e-4)
    empty = trace_stats([])
    assert (empty.num_requests, empty.requests_per_s, empty.prompt_tokens_p99) == (0, 0.0, 0.0)
    table = format_stats_table({"tiny": stats})
    assert "| tiny | 4 | 4.0 | 1.00 |" in table


def test_traces_cli(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main([str(FIXTURES / "azure_small.csv"), SYNTHETIC_CODING]) == 0
    out = capsys.readouterr().out
    assert "azure_small.csv | 4 |" in out and "| synthetic-coding |" in out
    assert main([str(_bad_csv(tmp_path))]) == 2
    assert "bad.csv, line 2: bad TIMESTAMP" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["--help"])  # not a trace called "--help"
    assert info.value.code == 0 and "TRACE" in capsys.readouterr().out


def _bad_csv(tmp_path: Path) -> Path:
    path = tmp_path / "bad.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\nx,1,1", encoding="utf-8")
    return path
