"""`python -m benchmarks.scheduler overhead`: fewer requests than a block, nonsense, and the
prefix cache the same on both sides (off by default, both cached when asked)."""

from __future__ import annotations

import pytest

from benchmarks.scheduler.overhead import cached_tokens, main

TINY = ["--model", "tiny-random", "--dtype", "float32"]


def test_fewer_requests_than_one_block_still_measure(capsys: pytest.CaptureFixture[str]) -> None:
    result = main([*TINY, "--requests", "10"])
    rows = result["rows"]
    assert [r["requests"] for r in rows] == [10, 10]  # type: ignore[index]
    assert all(r["direct_s"] > 0 and r["scheduled_s"] > 0 for r in rows)  # type: ignore[union-attr]
    assert "| 1 | 10 |" in capsys.readouterr().out


def test_the_prefix_cache_is_off_on_both_sides_by_default(
        capsys: pytest.CaptureFixture[str]) -> None:
    result = main([*TINY, "--requests", "4"])
    assert result["prefix_cache"] == "off"
    for r in result["rows"]:  # type: ignore[attr-defined]
        assert r["direct_cached_tokens"] == 0 and r["scheduled_cached_tokens"] == 0
        # its time split from the scheduler's op timeline: every part there, none negative
        parts = [r[k] for k in ("before_s", "ops_s", "ops_cpu_s", "between_s", "after_s")]
        assert r["ops_s"] > 0 and min(parts) >= 0
        assert sum(parts) - r["ops_cpu_s"] <= r["scheduled_s"] * 4 + 1e-3  # within the block
    out = capsys.readouterr().out
    assert "prefix cache: off on both sides" in out and "| before 1st op | ops |" in out


def test_both_sides_cached_when_asked(capsys: pytest.CaptureFixture[str]) -> None:
    result = main([*TINY, "--requests", "4", "--prefix-cache", "on"])
    assert result["prefix_cache"] == "on"
    short, long = result["rows"]  # type: ignore[misc]
    assert short["direct_cached_tokens"] == short["scheduled_cached_tokens"] == 0  # no full block
    # every repeat after the first hits the scheduler's cache, as every direct one does
    assert long["direct_cached_tokens"] == long["scheduled_cached_tokens"] == 112
    assert "prefix cache: on on both sides" in capsys.readouterr().out


def test_cached_tokens_are_full_blocks_short_of_the_last_token() -> None:
    assert [cached_tokens(n, True) for n in (1, 16, 17, 128, 129)] == [0, 0, 16, 112, 128]
    assert cached_tokens(128, False) == 0


def test_zero_requests_are_refused_with_a_message(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--requests", "0"])
    assert "--requests and --block must be >= 1" in capsys.readouterr().err


def test_an_unknown_prefix_cache_value_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--prefix-cache", "maybe"])
    assert "--prefix-cache" in capsys.readouterr().err
