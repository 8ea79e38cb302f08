"""loadgen probe --overhead: the summary's arithmetic, and a whole probe on a real slicegate."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from loadgen.__main__ import main
from loadgen.overhead import (
    ProbeConfig,
    Sample,
    markdown,
    run_probe,
    server_command,
    summarize,
)
from loadgen.timed_requests import RoundTrips
from loadgen.timeline import OpSpan


def _direct(case: tuple[int, int], ttft_s: float, total_s: float) -> dict:
    return {"case": list(case), "ttft_s": [ttft_s], "total_s": [total_s]}


def test_split_of_a_request_around_its_ops() -> None:
    spans = [OpSpan("cpu:0", 1.002, 1.010), OpSpan("cpu:0", 1.011, 1.020)]
    s = Sample((16, 2), "stream", 1.000, 1.015, 1.023, spans)
    split = s.split_ms()
    assert split.pop("ops_cpu") is None  # the server did not say
    assert split == pytest.approx({"before_first_op": 2.0, "ops": 17.0, "between_ops": 1.0,
                                   "after_last_op": 3.0, "outside_ops": 6.0})
    timed = [dataclasses.replace(x, cpu_s=0.006) for x in spans]
    assert Sample((16, 2), "stream", 1.000, 1.015, 1.023, timed).split_ms()["ops_cpu"] == \
        pytest.approx(12.0)
    assert Sample((16, 2), "json", 1.0, None, 1.1).split_ms() == {}


def test_overheads_are_server_minus_direct_medians() -> None:
    config = ProbeConfig(out=Path("x"), prompt_tokens=(16,), max_tokens=(1, 4))
    direct = [_direct((16, 1), 0.010, 0.010), _direct((16, 1), 0.012, 0.012),
              _direct((16, 1), 0.014, 0.014), _direct((16, 4), 0.010, 0.040)]
    samples = [Sample((16, 1), "json", 0.0, None, 0.013, paired=(0.0105, 0.0105)),
               Sample((16, 1), "stream", 0.0, 0.020, 0.021, paired=(0.016, 0.017)),
               Sample((16, 4), "json", 0.0, None, 0.060),
               Sample((16, 4), "stream", 0.0, 0.011, 0.041)]
    summary = summarize(config, direct, samples)
    rows = {(r["max_tokens"], r["mode"]): r for r in summary["rows"]}
    assert rows[1, "json"]["direct_total_ms"] == pytest.approx(12.0)
    assert rows[1, "json"]["overhead_ms"] == pytest.approx(1.0)
    assert rows[1, "json"]["ttft_overhead_ms"] is None  # no first token without a stream
    assert rows[1, "stream"]["overhead_ms"] == pytest.approx(9.0)
    assert rows[1, "stream"]["ttft_overhead_ms"] == pytest.approx(8.0)
    assert rows[4, "json"]["overhead_ms"] == pytest.approx(20.0)
    # each request against its own chain timed in the server, then the median
    assert rows[1, "json"]["paired_overhead_ms"] == pytest.approx(2.5)
    assert rows[1, "json"]["paired_ttft_overhead_ms"] is None
    assert rows[1, "stream"]["paired_overhead_ms"] == pytest.approx(4.0)
    assert rows[1, "stream"]["paired_ttft_overhead_ms"] == pytest.approx(4.0)
    assert rows[1, "stream"]["paired_direct_total_ms"] == pytest.approx(17.0)
    assert rows[4, "json"]["paired_overhead_ms"] is None  # not paired
    # the goal: single-token requests, both modes, paired: the worst is the stream's 4 ms
    assert summary["goal"]["worst_ms"] == pytest.approx(4.0) and summary["goal"]["met"]
    text = markdown(summary)
    assert "| 16 | 1 | stream | 12.0 | 20.0 | 12.0 | 21.0 | 9.0 | 17.0 | 4.0 | – |" in text
    assert "worst 4.0 ms, met; rows whose 95% interval lies above the goal: 0" in text
    # a single-token row without pairs leaves the goal unjudged, not met
    unpaired = summarize(config, direct, [dataclasses.replace(x, paired=None) for x in samples])
    assert unpaired["goal"]["worst_ms"] is None and not unpaired["goal"]["met"]
    assert summary["client"] is None and "client:" not in text  # no round trips timed
    json.dumps(summary)  # what the command writes


def test_a_miss_is_clear_only_where_the_pairs_interval_lies_above_the_goal() -> None:
    config = ProbeConfig(out=Path("x"), prompt_tokens=(16,), max_tokens=(1,))
    direct = [_direct((16, 1), 0.010, 0.010)]

    def pairs(mode: str, extra_ms: list[float]) -> list[Sample]:
        return [Sample((16, 1), mode, 0.0, None, 0.100 + e / 1e3, paired=(0.1, 0.1))
                for e in extra_ms]

    steady = pairs("json", [6.0 + 0.1 * i for i in range(20)])  # 6.0-7.9 ms: all above 5
    spread = pairs("stream", [-10.0 + 1.7 * i for i in range(20)])  # -10 to 22.3 ms
    summary = summarize(config, direct, steady + spread)
    rows = {r["mode"]: r for r in summary["rows"]}
    assert rows["json"]["paired_overhead_ci_ms"][0] > 5.0
    low, high = rows["stream"]["paired_overhead_ci_ms"]
    assert low < 5.0 < high and rows["stream"]["paired_overhead_ms"] > 5.0
    assert not summary["goal"]["met"] and summary["goal"]["clear_misses"] == 1
    assert "| 7.0 | 6.4 – 7.5 |" in markdown(summary)  # median 6.95; ranks 5 and 16 of 20


def test_what_httpx_adds_is_reported_beside_the_overhead_not_taken_from_it() -> None:
    config = ProbeConfig(out=Path("x"), prompt_tokens=(16,), max_tokens=(1,))
    direct = [_direct((16, 1), 0.010, 0.010)]
    samples = [Sample((16, 1), "json", 0.0, None, 0.013)]
    trips = RoundTrips(httpx_s=[0.0011, 0.00114, 0.0030], lean_s=[0.0004, 0.00043, 0.0009])
    summary = summarize(config, direct, samples, trips)
    assert summary["client"] == pytest.approx({"round_trips": 3, "httpx_ms": 1.14,
                                               "lean_ms": 0.43, "httpx_extra_ms": 0.71})
    assert summary["rows"][0]["overhead_ms"] == pytest.approx(3.0)  # nothing subtracted
    assert markdown(summary).splitlines()[-1] == (
        "client: GET /health round trip 0.43 ms lean, 1.14 ms httpx (httpx adds 0.71 ms; "
        "not in the overhead above)")
    json.dumps(summary)


def test_direct_runs_on_the_threads_of_the_servers_executors(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    assert ProbeConfig(out=Path("x"), devices="cpu:0").direct_threads() == 8
    assert ProbeConfig(out=Path("x"), devices="cpu:0,cpu:1").direct_threads() == 4
    assert ProbeConfig(out=Path("x"), devices="cpu:0", threads=1).direct_threads() == 1


def test_threads_are_the_servers_and_directs(tmp_path: Path) -> None:
    one = server_command(ProbeConfig(out=tmp_path, threads=1), 8000)
    assert one[one.index("--cpu-threads") + 1] == "1"
    assert "--cpu-threads" not in server_command(ProbeConfig(out=tmp_path), 8000)


def test_probe_needs_to_be_told_what_to_probe(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe"]) != 0
    assert "say what to probe: --overhead" in capsys.readouterr().err


def test_probe_on_slicegate(tmp_path: Path) -> None:
    """The real `python -m gateway serve --model tiny-random` beside `python -m models direct`."""
    config = ProbeConfig(out=tmp_path, model="tiny-random", dtype="float32", prompt_tokens=(8,),
                         max_tokens=(1, 3), requests=2, rounds=1, warmup=1, ready_timeout_s=120)
    summary = run_probe(config)
    assert len(summary["rows"]) == 4
    for r in summary["rows"]:
        assert r["requests"] == 2 and r["direct_total_ms"] > 0 and r["server_total_ms"] > 0
        assert r["overhead_ms"] is not None
        # each request paired with its chain timed on the server's executor thread
        assert r["paired_direct_total_ms"] > 0 and r["paired_overhead_ms"] is not None
        assert (r["paired_ttft_overhead_ms"] is not None) == (r["mode"] == "stream")
        assert (r["server_ttft_ms"] is not None) == (r["mode"] == "stream")
        split = r["split_ms"]
        assert split["ops"] is not None and split["ops"] > 0  # spans from /admin/timeline
        # the executor threads' CPU time in the ops: measured, and never above their wall time
        assert split["ops_cpu"] is not None and 0 < split["ops_cpu"] <= split["ops"] + 0.5
    assert summary["goal"]["worst_ms"] is not None
    assert summary["pairs_redone"] >= 0 and "pairs timed again" in markdown(summary)
    # GET /health through httpx and the lean connection, each round (warm-up not counted)
    client = summary["client"]
    assert client["round_trips"] == config.health_round_trips
    assert client["lean_ms"] > 0 and client["httpx_ms"] > 0


def test_the_probed_server_recomputes_every_prompt_as_direct_does(tmp_path: Path) -> None:
    # a prefix cache would serve repeated probe prompts from KV that `direct` recomputes
    command = server_command(ProbeConfig(out=tmp_path), 8000)
    assert "--no-prefix-cache" in command and command[command.index("--port") + 1] == "8000"
