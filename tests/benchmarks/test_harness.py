"""What the benches share: the machine line, `--json`, tables, medians and the dispatch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import harness
from models.cpu import cpu_caps


def test_the_machine_line_is_the_models_capability_line_and_the_load() -> None:
    line = harness.machine_line()
    assert line.startswith(f"machine: {cpu_caps().line()}; load average ")
    assert harness.machine()["machine"] == cpu_caps().line()


def test_json_goes_to_the_file_named_to_stdout_without_one_and_nowhere_unasked(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = harness.parser("python -m benchmarks.x y", "A bench.\n\nMore.")
    assert p.description == "A bench."
    out = tmp_path / "r.json"
    for argv, where in ((["--json", str(out)], out), (["--json"], harness.STDOUT),
                        (["--json", "-"], harness.STDOUT), ([], None)):
        assert p.parse_args(argv).json == where
    harness.write_json(out, {"a": 1})
    harness.write_json(harness.STDOUT, {"b": 2})
    harness.write_json(None, {"c": 3})
    assert json.loads(out.read_text()) == {"a": 1}
    assert json.loads(capsys.readouterr().out) == {"b": 2}


def test_a_table_is_markdown_with_its_columns_aligned(capsys: pytest.CaptureFixture[str]) -> None:
    harness.print_table(["case", "ms"], "lr", [["prefill 16", "1.5"], ["decode b=1", 2]])
    assert capsys.readouterr().out.splitlines() == [
        "| case | ms |", "|---|---:|", "| prefill 16 | 1.5 |", "| decode b=1 | 2 |"]


def test_median_s_times_every_repeat() -> None:
    calls: list[int] = []
    assert harness.median_s(lambda: calls.append(1), 5) >= 0.0
    assert len(calls) == 5


def test_dispatch_runs_the_named_bench_and_refuses_others() -> None:
    seen: list[list[str] | None] = []
    benches: dict[str, harness.Bench] = {"one": seen.append}
    harness.dispatch("python -m benchmarks.x", benches, ["one", "--json", "f"])
    assert seen == [["--json", "f"]]
    for argv in ([], ["two"], ["--help"]):
        with pytest.raises(SystemExit) as info:
            harness.dispatch("python -m benchmarks.x", benches, argv)
        assert str(info.value).startswith("usage: python -m benchmarks.x {one} [--json FILE]")


def test_dispatch_turns_a_missing_file_into_a_message() -> None:
    def missing(argv: list[str] | None) -> None:
        raise FileNotFoundError("no model here")
    with pytest.raises(SystemExit) as info:
        harness.dispatch("python -m benchmarks.x", {"one": missing}, ["one"])
    assert str(info.value) == "error: no model here"
