"""Tests for loadgen.traces (trace readers, load_trace, stats) and loadgen.synthetic."""

from __future__ import annotations

import ast
import gzip
import io
import pickle
import sys
from datetime import datetime
from pathlib import Path

import pytest

from loadgen import synthetic
from loadgen.traces import (
    SYNTHETIC_CODING,
    TraceError,
    TraceOptions,
    TraceRequest,
    apply_options,
    format_azure_timestamp,
    load_trace,
    read_azure,
    read_mooncake,
    read_synthetic_coding,
    read_trace,
    write_azure_csv,
)
from loadgen.tracestats import trace_stats

FIXTURES = Path(__file__).resolve().parent / "fixtures"
REPO = Path(__file__).resolve().parents[2]
SHARED_TRACES = REPO.parent / "shared" / "traces"
SHIPPED = REPO / "loadgen" / "data" / "synthetic_coding.csv"

AZURE_SMALL = [
    TraceRequest(0.0, 4808, 10),
    TraceRequest(0.052, 3180, 8),
    TraceRequest(0.052, 110, 27),
    TraceRequest(1.140684, 0, 14),
]
MOONCAKE_SMALL = [
    TraceRequest(0.0, 6758, 500, (0, 1, 2)),
    TraceRequest(0.0, 7322, 490, (0, 3)),
    TraceRequest(3.0, 2290, 3, ()),
    TraceRequest(6.5005, 12, 1, ()),
]
HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
ROW = "2023-11-16 18:17:03.9799600,4808,10\n"
MOONCAKE_ROW = b'{"timestamp": 0, "input_length": 1, "output_length": 1}\n'


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _requests(*rows: tuple[float, int, int]) -> list[TraceRequest]:
    return [TraceRequest(t, p, o) for t, p, o in rows]


# --- readers on fixtures ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["azure_small.csv", "azure_small.csv.gz"])
def test_read_azure_fixture(name: str) -> None:
    assert read_azure(FIXTURES / name) == AZURE_SMALL
    assert read_trace(FIXTURES / name) == AZURE_SMALL


@pytest.mark.parametrize("name", ["mooncake_small.jsonl", "mooncake_small.jsonl.gz"])
def test_read_mooncake_fixture(name: str) -> None:
    assert read_mooncake(FIXTURES / name) == MOONCAKE_SMALL
    assert read_trace(str(FIXTURES / name)) == MOONCAKE_SMALL


def test_gzip_is_detected_by_magic_bytes(tmp_path: Path) -> None:
    csv_path = tmp_path / "renamed.csv"
    csv_path.write_bytes((FIXTURES / "azure_small.csv.gz").read_bytes())
    jsonl_path = tmp_path / "renamed.jsonl"
    jsonl_path.write_bytes((FIXTURES / "mooncake_small.jsonl.gz").read_bytes())
    assert read_azure(csv_path) == AZURE_SMALL
    assert read_mooncake(jsonl_path) == MOONCAKE_SMALL


def test_azure_timestamps_keep_seven_digits_and_cross_midnight(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "t.csv",
        HEADER + "2023-12-31 23:59:59.9999999,1,1\r\n2024-01-01 00:00:00.0000001,2,2\r\n"
        "2024-01-01T00:00:01,3,3\n\n",
    )
    assert [r.arrival_s for r in read_azure(path)] == [0.0, 2e-7, 1.0000001]


def test_azure_columns_in_any_order_and_extra_columns(tmp_path: Path) -> None:
    text = "GeneratedTokens,Extra,TIMESTAMP,ContextTokens\n7,x,2023-11-16 18:17:03.5,42"
    assert read_azure(_write(tmp_path, "t.csv", text)) == _requests((0.0, 42, 7))


def test_empty_trace_files_read_as_no_requests(tmp_path: Path) -> None:
    assert read_azure(_write(tmp_path, "t.csv", HEADER)) == []
    assert read_mooncake(_write(tmp_path, "t.jsonl", "\n")) == []


# --- malformed rows --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("", 1, "empty file"),
        ("TIMESTAMP,ContextTokens\n" + ROW, 1, "missing column 'GeneratedTokens'"),
        (HEADER + ROW + "2023-11-16 18:17:04.0,12\n", 3, "missing column 'GeneratedTokens'"),
        (HEADER + ROW + "2023-11-16 18:17:04.0,,5\n", 3, "missing column 'ContextTokens'"),
        (HEADER + "2023-11-16 18:17:04.0,12.5,3\n", 2, "ContextTokens is not an integer"),
        (HEADER + "2023-11-16 18:17:04.0,1_000,3\n", 2, "ContextTokens is not an integer"),
        (HEADER + "2023-11-16 18:17:04.0,12,many\n", 2, "GeneratedTokens is not an integer"),
        (HEADER + "2023-11-16 18:17:04.0,-12,3\n", 2, "ContextTokens is negative"),
        (HEADER + "2023-11-16 18:17:04.0,12,-3\n", 2, "GeneratedTokens is negative"),
        (HEADER + ROW + "yesterday,12,3\n", 3, "bad TIMESTAMP 'yesterday'"),
        (HEADER + "2023-11-16 25:17:04.0,12,3\n", 2, "bad TIMESTAMP"),
        (HEADER + "2023-02-30 18:17:04.0,12,3\n", 2, "bad TIMESTAMP"),
        (HEADER + "2023-11-16 18:17:04.0+01:00,12,3\n", 2, "bad TIMESTAMP"),
        (HEADER + ROW + "2023-11-16 18:17:03.4799600,1,1", 3, "goes backwards by 0.500000 s"),
        (HEADER + ROW + '"2023-11-16 18:17:04,1,1\n', 3, "bad CSV"),
    ],
)
def test_malformed_azure_rows(tmp_path: Path, text: str, line: int, fragment: str) -> None:
    path = _write(tmp_path, "bad.csv", text)
    with pytest.raises(TraceError) as info:
        read_azure(path)
    message = str(info.value)
    assert info.value.line == line
    assert message.startswith(f"{path}, line {line}: ")
    assert fragment in message


@pytest.mark.parametrize(
    ("row", "fragment"),
    [
        ('{"timestamp": 5, "input_length": 1,', "bad JSON"),
        ("[1, 2, 3]", "bad JSON: expected an object"),
        ('{"timestamp": 5, "output_length": 1}', "missing column 'input_length'"),
        ('{"input_length": 1, "output_length": 1}', "missing column 'timestamp'"),
        ('{"timestamp": 5, "input_length": 1.5, "output_length": 1}', "input_length is not an"),
        ('{"timestamp": 5, "input_length": "7", "output_length": 1}', "input_length is not an"),
        ('{"timestamp": 5, "input_length": 7, "output_length": true}', "output_length is not an"),
        ('{"timestamp": 5, "input_length": -7, "output_length": 1}', "input_length is negative"),
        ('{"timestamp": 5, "input_length": 7, "output_length": -1}', "output_length is negative"),
        ('{"timestamp": "5", "input_length": 7, "output_length": 1}', "bad timestamp '5'"),
        ('{"timestamp": -5, "input_length": 7, "output_length": 1}', "bad timestamp -5"),
        ('{"timestamp": NaN, "input_length": 7, "output_length": 1}', "bad timestamp nan"),
        ('{"timestamp": 2, "input_length": 7, "output_length": 1}', "goes backwards by 0.001"),
        ('{"timestamp": 5, "input_length": 7, "output_length": 1, "hash_ids": [1, "a"]}', "hash"),
        ('{"timestamp": 5, "input_length": 7, "output_length": 1, "hash_ids": 3}', "hash_ids"),
    ],
)
def test_malformed_mooncake_rows(tmp_path: Path, row: str, fragment: str) -> None:
    good = '{"timestamp": 3, "input_length": 1, "output_length": 1}\n'
    path = _write(tmp_path, "bad.jsonl", good + "\n" + row + "\n" + good)
    with pytest.raises(TraceError) as info:
        read_mooncake(path)
    assert info.value.line == 3
    assert str(info.value).startswith(f"{path}, line 3: ")
    assert fragment in str(info.value)


def test_unreadable_gzip_is_a_trace_error(tmp_path: Path) -> None:
    not_gzip = _write(tmp_path, "t.csv.gz", HEADER + ROW)
    with pytest.raises(TraceError, match=r"t\.csv\.gz: cannot read the file"):
        read_azure(not_gzip)
    truncated = tmp_path / "cut.jsonl.gz"
    truncated.write_bytes(gzip.compress(MOONCAKE_ROW * 100)[:60])
    with pytest.raises(TraceError, match=r"cut\.jsonl\.gz: cannot read the file"):
        read_mooncake(truncated)


def test_undecodable_bytes_are_a_trace_error(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes(HEADER.encode() + b"\xff\xfe,1,1\n")
    with pytest.raises(TraceError, match="cannot read the file"):
        read_azure(path)


def test_trace_error_is_a_value_error_and_pickles() -> None:
    error = TraceError("x.csv", 7, "ContextTokens is negative: -1")
    assert isinstance(error, ValueError)
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.source, copy.line, copy.problem, str(copy)) == (
        "x.csv",
        7,
        "ContextTokens is negative: -1",
        "x.csv, line 7: ContextTokens is negative: -1",
    )


# --- load_trace ------------------------------------------------------------------------


def test_load_trace_defaults_read_the_file_unchanged_except_zero_tokens() -> None:
    loaded = load_trace(str(FIXTURES / "azure_small.csv"))
    assert loaded[:3] == AZURE_SMALL[:3]
    assert loaded[3] == TraceRequest(1.140684, 1, 14)  # 0 prompt tokens -> 1
    assert load_trace(str(FIXTURES / "mooncake_small.jsonl.gz")) == MOONCAKE_SMALL


def test_load_trace_rejects_unknown_and_missing_files(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown trace format.*synthetic-coding"):
        load_trace(str(_write(tmp_path, "trace.txt", "")))
    with pytest.raises(FileNotFoundError):
        load_trace(str(tmp_path / "absent.csv"))
    with pytest.raises(ValueError, match="holds no requests"):
        load_trace(str(_write(tmp_path, "empty.csv", HEADER)))


def test_window_keeps_start_inclusive_end_exclusive_and_rebases(tmp_path: Path) -> None:
    trace = _requests((0.0, 1, 1), (1.0, 2, 2), (2.5, 3, 3), (4.0, 4, 4), (5.0, 5, 5))
    windowed = apply_options(trace, TraceOptions(window_s=(1.0, 4.0)))
    assert windowed == _requests((0.0, 2, 2), (1.5, 3, 3))
    late = apply_options(trace, TraceOptions(window_s=(0.5, float("inf"))))
    assert [r.arrival_s for r in late] == [0.0, 1.5, 3.0, 4.0]


def test_empty_window_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"selects no requests .*\(4 requests over 1\.1 s"):
        load_trace(str(FIXTURES / "azure_small.csv"), window_s=(100.0, 200.0))


def test_rate_scale_compresses_arrivals_and_max_requests_truncates() -> None:
    trace = _requests((10.0, 1, 1), (12.0, 1, 1), (20.0, 1, 1))
    assert [r.arrival_s for r in apply_options(trace, TraceOptions(rate_scale=2.0))] == [
        0.0,
        1.0,
        5.0,
    ]
    assert [r.arrival_s for r in apply_options(trace, TraceOptions(rate_scale=0.5))] == [
        0.0,
        4.0,
        20.0,
    ]
    assert len(apply_options(trace, TraceOptions(max_requests=2))) == 2


def test_token_scale_rounds_with_a_floor_of_one() -> None:
    trace = [TraceRequest(0.0, 1000, 3, (4, 5)), TraceRequest(1.0, 1, 0)]
    scaled = apply_options(trace, TraceOptions(token_scale=0.25))
    assert scaled == [TraceRequest(0.0, 250, 1, (4, 5)), TraceRequest(1.0, 1, 1)]
    assert apply_options(trace, TraceOptions(token_scale=1.5))[0].prompt_tokens == 1500


@pytest.mark.parametrize(
    ("caps", "expected"),
    [
        ({"max_prompt_tokens": 100}, (100, 50)),
        ({"max_output_tokens": 20}, (1000, 20)),
        ({"max_total_tokens": 600}, (550, 50)),  # the prompt gives way first
        ({"max_total_tokens": 30}, (1, 29)),  # then the output; both stay >= 1
        ({"max_total_tokens": 2}, (1, 1)),
        ({"max_prompt_tokens": 500, "max_output_tokens": 40, "max_total_tokens": 520}, (480, 40)),
    ],
)
def test_caps_clip_and_never_drop(caps: dict[str, int], expected: tuple[int, int]) -> None:
    trace = [TraceRequest(0.0, 1000, 50), TraceRequest(1.0, 10, 5)]
    capped = apply_options(trace, TraceOptions(**caps))  # type: ignore[arg-type]
    assert len(capped) == 2
    assert (capped[0].prompt_tokens, capped[0].output_tokens) == expected
    assert capped[1].prompt_tokens + capped[1].output_tokens <= max(15, min(caps.values()))


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"rate_scale": 0.0}, "rate_scale must be a finite number > 0"),
        ({"rate_scale": -1.0}, "rate_scale"),
        ({"rate_scale": float("inf")}, "rate_scale"),
        ({"rate_scale": float("nan")}, "rate_scale"),
        ({"rate_scale": "2"}, "rate_scale must be a number"),
        ({"token_scale": 0}, "token_scale"),
        ({"max_prompt_tokens": 0}, "max_prompt_tokens must be None or an integer >= 1"),
        ({"max_output_tokens": 2.5}, "max_output_tokens"),
        ({"max_total_tokens": 1}, "max_total_tokens must be None or an integer >= 2"),
        ({"max_requests": 0}, "max_requests"),
        ({"max_requests": True}, "max_requests"),
        ({"window_s": (5.0, 5.0)}, "0 <= start < end"),
        ({"window_s": (-1.0, 5.0)}, "0 <= start < end"),
        ({"window_s": (float("inf"), float("inf"))}, "0 <= start < end"),
        ({"window_s": (0.0, float("nan"))}, "two numbers"),
        ({"window_s": (1.0,)}, "(start, end) pair"),
    ],
)
def test_bad_options_are_value_errors(options: dict[str, object], fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        load_trace(SYNTHETIC_CODING, **options)  # type: ignore[arg-type]
    assert not isinstance(info.value, TraceError)
    assert fragment in str(info.value)


# --- real traces -----------------------------------------------------------------------


def test_real_traces_parse() -> None:
    """The public traces in ../shared/traces parse (CI has them); else the shipped trace does."""
    if not SHARED_TRACES.is_dir():
        stats = trace_stats(load_trace(SYNTHETIC_CODING))
        assert stats.num_requests == len(SHIPPED.read_text().splitlines()) - 1
        return
    expected = {
        "AzureLLMInferenceTrace_code.csv.gz": (8819, 3435.9),
        "AzureLLMInferenceTrace_conv.csv.gz": (19366, 3501.7),
        "mooncake_FAST25_conversation_trace.jsonl.gz": (12031, 3537.0),
    }
    for name, (count, duration_s) in expected.items():
        requests = load_trace(str(SHARED_TRACES / name))
        assert len(requests) == count, name
        assert requests[0].arrival_s == 0.0
        assert requests[-1].arrival_s == pytest.approx(duration_s, abs=0.1), name
    mooncake = load_trace(str(SHARED_TRACES / "mooncake_FAST25_conversation_trace.jsonl.gz"))
    assert mooncake[1].hash_ids[:1] == (0,)


def test_azure_code_trace_first_gap_is_exact() -> None:
    path = SHARED_TRACES / "AzureLLMInferenceTrace_code.csv.gz"
    if not path.exists():
        path = FIXTURES / "azure_small.csv.gz"  # the same first two timestamps
    first, second = read_azure(path)[:2]
    assert (first.arrival_s, second.arrival_s) == (0.0, 0.052)


# --- synthetic trace -------------------------------------------------------------------


def test_synthetic_generator_is_deterministic() -> None:
    assert synthetic.generate(seed=7, duration_s=120) == synthetic.generate(seed=7, duration_s=120)
    assert synthetic.generate(seed=7, duration_s=120) != synthetic.generate(seed=8, duration_s=120)


def test_shipped_trace_matches_the_generator(capsys: pytest.CaptureFixture[str]) -> None:
    assert synthetic.main([]) == 0
    assert capsys.readouterr().out == SHIPPED.read_text(encoding="utf-8")
    assert load_trace(SYNTHETIC_CODING) == synthetic.generate()  # exact round trip


def test_shipped_trace_is_small_and_read_as_package_data() -> None:
    assert SHIPPED.stat().st_size <= 100_000
    assert read_synthetic_coding() == read_azure(SHIPPED)


@pytest.mark.parametrize("seed", [synthetic.DEFAULT_SEED, 1, 2, 3])
def test_synthetic_stats_are_in_the_intended_ranges(seed: int) -> None:
    requests = synthetic.generate(seed)
    stats = trace_stats(requests)
    assert 1500 <= stats.num_requests <= 2100
    assert requests[0].arrival_s == 0.0
    assert requests[-1].arrival_s < synthetic.DEFAULT_DURATION_S
    assert stats.num_requests / synthetic.DEFAULT_DURATION_S == pytest.approx(3.0, rel=0.1)
    assert stats.interarrival_cov > 4  # bursty: Poisson arrivals give 1
    assert 1200 <= stats.prompt_tokens_p50 <= 1800
    assert 4000 <= stats.prompt_tokens_p90 <= 6500
    assert max(r.prompt_tokens for r in requests) <= synthetic.PROMPT_MAX
    assert 11 <= stats.output_tokens_p50 <= 15
    assert 40 <= stats.output_tokens_p90 <= 75
    assert 120 <= stats.output_tokens_p99 <= synthetic.OUTPUT_MAX
    assert min(r.output_tokens for r in requests) >= synthetic.OUTPUT_MIN


def test_synthetic_arguments_are_validated() -> None:
    with pytest.raises(ValueError, match="mean_rate"):
        synthetic.generate(mean_rate=0)
    with pytest.raises(ValueError, match="duration_s"):
        synthetic.generate(duration_s=float("inf"))
    fast = synthetic.generate(duration_s=60, mean_rate=30)
    assert all(r.arrival_s < 60 for r in fast)


# --- writing, stats, CLI, imports ------------------------------------------------------


def test_azure_writer_round_trips(tmp_path: Path) -> None:
    requests = _requests((0.0, 5, 6), (0.1234567, 7, 8), (86401.5, 9, 10))
    out = io.StringIO()
    write_azure_csv(requests, out, start=datetime(2024, 2, 28, 23, 59, 59))
    assert out.getvalue().splitlines()[3] == "2024-03-01 00:00:00.5000000,9,10"
    assert read_azure(_write(tmp_path, "w.csv", out.getvalue())) == requests
    assert format_azure_timestamp(datetime(2024, 1, 1), 1.99999999) == "2024-01-01 00:00:02.0000000"


@pytest.mark.parametrize("module", ["traces.py", "tracestats.py", "synthetic.py"])
def test_loadgen_trace_modules_import_only_the_stdlib(module: str) -> None:
    tree = ast.parse((REPO / "loadgen" / module).read_text(encoding="utf-8"))
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    outside = {name for name in imported if name.split(".")[0] not in sys.stdlib_module_names}
    assert outside <= {"loadgen.traces"}
