"""Readers for LLM inference request traces.

Two public formats are read, plain or gzip-compressed:

- **Azure** (Azure LLM inference trace 2023): CSV with the header
  ``TIMESTAMP,ContextTokens,GeneratedTokens``; ``TIMESTAMP`` is a naive
  wall-clock time such as ``2023-11-16 18:17:03.9799600`` (up to 9
  fractional digits are kept, more are truncated).
- **Mooncake** (FAST'25): JSON Lines with ``timestamp`` (ms),
  ``input_length``, ``output_length`` and optional ``hash_ids``.

``load_trace("synthetic-coding")`` reads the trace shipped with the package
(``loadgen/data/synthetic_coding.csv``, made by ``python -m loadgen.synthetic``).

This module imports nothing from the other slicegate packages, so the
scheduler's benchmarks may use it. ``python -m loadgen.tracestats SPEC...``
prints a stats table.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import IO, NamedTuple

SYNTHETIC_CODING = "synthetic-coding"
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")

_EPOCH = datetime(1970, 1, 1)
_ONE_SECOND = timedelta(seconds=1)
_NS_PER_S = 1_000_000_000
_TIMESTAMP_RE = re.compile(
    r"(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:\.(\d{1,9})\d*)?", re.ASCII
)
_INT_RE = re.compile(r"[+-]?[0-9]+", re.ASCII)
_GZIP_MAGIC = b"\x1f\x8b"


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file, the line and the problem."""

    def __init__(self, source: str, line: int | None, problem: str) -> None:
        where = source if line is None else f"{source}, line {line}"
        super().__init__(f"{where}: {problem}")
        self.source = source
        self.line = line  # 1-based physical line; None when it is not known
        self.problem = problem

    def __reduce__(self) -> tuple[type[TraceError], tuple[str, int | None, str]]:
        return (TraceError, (self.source, self.line, self.problem))


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace."""

    arrival_s: float  # seconds since the trace start (the first request is at 0)
    prompt_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()  # prefix-block hashes (Mooncake: 512-token blocks)


class _RawRow(NamedTuple):
    time_ns: int  # absolute (Azure) or trace-relative (Mooncake) time
    prompt_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]
    line: int


# --- reading ---------------------------------------------------------------------------


def read_azure(path: str | Path) -> list[TraceRequest]:
    """Read an Azure-format CSV trace (plain or gzip); arrivals are relative to the first row."""
    return _read(Path(path), _azure_rows)


def read_mooncake(path: str | Path) -> list[TraceRequest]:
    """Read a Mooncake-format JSONL trace (plain or gzip); arrivals relative to the first row."""
    return _read(Path(path), _mooncake_rows)


def read_trace(path: str | Path) -> list[TraceRequest]:
    """Read a trace file; the name picks the format (.csv[.gz] Azure, .jsonl[.gz] Mooncake)."""
    path = Path(path)
    name = path.name.lower().removesuffix(".gz")
    if name.endswith(".csv"):
        return read_azure(path)
    if name.endswith(".jsonl"):
        return read_mooncake(path)
    raise ValueError(
        f"unknown trace format for {str(path)!r}: expected a .csv or .csv.gz (Azure) or a "
        f".jsonl or .jsonl.gz (Mooncake) file, or {SYNTHETIC_CODING!r}"
    )


def read_synthetic_coding() -> list[TraceRequest]:
    """Read the synthetic coding trace shipped in ``loadgen/data/synthetic_coding.csv``."""
    with resources.as_file(_synthetic_coding_resource()) as path:
        return read_azure(path)


def _synthetic_coding_resource() -> Traversable | Path:
    resource = resources.files("loadgen").joinpath("data").joinpath("synthetic_coding.csv")
    if resource.is_file():
        return resource
    # NOTE: when a folder named loadgen without __init__.py comes first on sys.path (tests/
    # under plain `pytest`), `loadgen` imports as a namespace package and its resources
    # resolve into that folder; the file then is beside this module.
    return Path(__file__).with_name("data") / "synthetic_coding.csv"


_RowParser = Callable[[IO[str], str], Iterator[_RawRow]]


def _read(path: Path, rows: _RowParser) -> list[TraceRequest]:
    source = str(path)
    with _open_text(path) as stream:
        try:
            return _assemble(rows(stream, source), source)
        except (OSError, EOFError, UnicodeDecodeError) as exc:
            raise TraceError(source, None, f"cannot read the file: {exc}") from exc


def _open_text(path: Path) -> IO[str]:
    with path.open("rb") as raw:
        magic = raw.read(2)
    if magic == _GZIP_MAGIC or path.name.lower().endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8-sig", newline="")
    return path.open("r", encoding="utf-8-sig", newline="")


def _assemble(rows: Iterable[_RawRow], source: str) -> list[TraceRequest]:
    """Check that time never goes backwards and make arrivals relative to the first row."""
    requests: list[TraceRequest] = []
    origin_ns = previous_ns = previous_line = 0
    for row in rows:
        if not requests:
            origin_ns = row.time_ns
        elif row.time_ns < previous_ns:
            back_s = (previous_ns - row.time_ns) / _NS_PER_S
            raise TraceError(
                source,
                row.line,
                f"timestamp goes backwards by {back_s:.6f} s (previous row: line {previous_line})",
            )
        arrival_s = (row.time_ns - origin_ns) / _NS_PER_S
        requests.append(TraceRequest(arrival_s, row.prompt_tokens, row.output_tokens, row.hash_ids))
        previous_ns, previous_line = row.time_ns, row.line
    return requests


def _azure_rows(stream: IO[str], source: str) -> Iterator[_RawRow]:
    reader = csv.reader(stream, strict=True)
    try:
        columns = _azure_header(reader, source)
        for row in reader:
            if any(cell.strip() for cell in row):
                yield _azure_row(row, columns, source, reader.line_num)
    except csv.Error as exc:
        raise TraceError(source, reader.line_num, f"bad CSV: {exc}") from exc


def _azure_header(reader: Iterator[list[str]], source: str) -> dict[str, int]:
    header = next(reader, None)
    if header is None:
        raise TraceError(source, 1, f"empty file: expected the header {','.join(AZURE_COLUMNS)}")
    index = {name.strip(): i for i, name in enumerate(header)}
    for name in AZURE_COLUMNS:
        if name not in index:
            raise TraceError(
                source, 1, f"missing column {name!r} in the header (found {','.join(header)!r})"
            )
    return index


def _azure_row(row: list[str], columns: dict[str, int], source: str, line: int) -> _RawRow:
    cells = {}
    for name in AZURE_COLUMNS:
        i = columns[name]
        if i >= len(row) or not row[i].strip():
            raise TraceError(source, line, f"missing column {name!r} (row has {len(row)} fields)")
        cells[name] = row[i].strip()
    return _RawRow(
        time_ns=_timestamp_ns(cells["TIMESTAMP"], source, line),
        prompt_tokens=_csv_tokens(cells["ContextTokens"], "ContextTokens", source, line),
        output_tokens=_csv_tokens(cells["GeneratedTokens"], "GeneratedTokens", source, line),
        hash_ids=(),
        line=line,
    )


def _timestamp_ns(text: str, source: str, line: int) -> int:
    """Nanoseconds since 1970-01-01 of a naive timestamp, exact (no float rounding)."""
    match = _TIMESTAMP_RE.fullmatch(text)
    problem = f"bad TIMESTAMP {text!r}: expected 'YYYY-MM-DD HH:MM:SS[.fffffff]'"
    if match is None:
        raise TraceError(source, line, problem)
    try:
        whole = datetime.strptime(f"{match[1]} {match[2]}", "%Y-%m-%d %H:%M:%S")
    except ValueError as exc:
        raise TraceError(source, line, f"{problem} ({exc})") from exc
    fraction_ns = int((match[3] or "").ljust(9, "0"))
    return (whole - _EPOCH) // _ONE_SECOND * _NS_PER_S + fraction_ns


def _csv_tokens(text: str, name: str, source: str, line: int) -> int:
    if _INT_RE.fullmatch(text) is None:
        raise TraceError(source, line, f"{name} is not an integer: {text!r}")
    return _non_negative(int(text), name, source, line)


def _mooncake_rows(stream: IO[str], source: str) -> Iterator[_RawRow]:
    for line, text in enumerate(stream, start=1):
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TraceError(source, line, f"bad JSON: {exc.msg} (column {exc.colno})") from exc
        if not isinstance(record, dict):
            raise TraceError(source, line, f"bad JSON: expected an object, got {text.strip()!r}")
        yield _mooncake_row(record, source, line)


def _mooncake_row(record: dict[str, object], source: str, line: int) -> _RawRow:
    for key in ("timestamp", "input_length", "output_length"):
        if key not in record:
            raise TraceError(source, line, f"missing column {key!r}")
    return _RawRow(
        time_ns=_milliseconds_ns(record["timestamp"], source, line),
        prompt_tokens=_json_tokens(record["input_length"], "input_length", source, line),
        output_tokens=_json_tokens(record["output_length"], "output_length", source, line),
        hash_ids=_hash_ids(record.get("hash_ids"), source, line),
        line=line,
    )


def _milliseconds_ns(value: object, source: str, line: int) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value * 1_000_000
    if isinstance(value, float) and math.isfinite(value) and value >= 0:
        return round(value * 1e6)
    raise TraceError(source, line, f"bad timestamp {value!r}: expected milliseconds >= 0")


def _json_tokens(value: object, name: str, source: str, line: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TraceError(source, line, f"{name} is not an integer: {value!r}")
    return _non_negative(value, name, source, line)


def _non_negative(value: int, name: str, source: str, line: int) -> int:
    if value < 0:
        raise TraceError(source, line, f"{name} is negative: {value}")
    return value


def _hash_ids(value: object, source: str, line: int) -> tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(
        isinstance(h, int) and not isinstance(h, bool) for h in value
    ):
        raise TraceError(source, line, f"hash_ids is not a list of integers: {value!r}")
    return tuple(value)


# --- writing ---------------------------------------------------------------------------


def format_azure_timestamp(start: datetime, arrival_s: float) -> str:
    """``start + arrival_s`` as an Azure TIMESTAMP, rounded to 100 ns (7 fractional digits)."""
    ticks = round(arrival_s * 10_000_000)
    seconds, fraction = divmod(ticks, 10_000_000)
    return f"{start + timedelta(seconds=seconds):%Y-%m-%d %H:%M:%S}.{fraction:07d}"


def write_azure_csv(requests: Iterable[TraceRequest], out: IO[str], *, start: datetime) -> None:
    """Write requests as an Azure-format CSV (``\\n`` line ends); hash_ids are not written."""
    out.write(",".join(AZURE_COLUMNS) + "\n")
    for r in requests:
        out.write(
            f"{format_azure_timestamp(start, r.arrival_s)},{r.prompt_tokens},{r.output_tokens}\n"
        )


# --- load_trace ------------------------------------------------------------------------


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class TraceOptions:
    """How ``load_trace`` reshapes a trace; see ``load_trace`` for the meaning of each field."""

    window_s: tuple[float, float] | None = None  # [start, end) offsets in the original trace
    rate_scale: float = 1.0  # > 1: arrivals compressed by this factor
    token_scale: float = 1.0
    max_prompt_tokens: int | None = None
    max_output_tokens: int | None = None
    max_total_tokens: int | None = None
    max_requests: int | None = None

    def __post_init__(self) -> None:
        if self.window_s is not None:
            _check_window(self.window_s)
        for name in ("rate_scale", "token_scale"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{name} must be a number, got {value!r}")
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        for name, least in (
            ("max_prompt_tokens", 1),
            ("max_output_tokens", 1),
            ("max_total_tokens", 2),
            ("max_requests", 1),
        ):
            value = getattr(self, name)
            if value is not None and not (_is_int(value) and value >= least):
                raise ValueError(f"{name} must be None or an integer >= {least}, got {value!r}")


def _check_window(window_s: tuple[float, float]) -> None:
    if not isinstance(window_s, tuple | list) or len(window_s) != 2:
        raise ValueError(f"window_s must be a (start, end) pair of seconds, got {window_s!r}")
    start, end = window_s
    for value in window_s:
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
            raise ValueError(f"window_s must hold two numbers, got {window_s!r}")
    if not (math.isfinite(start) and start >= 0 and end > start):
        raise ValueError(f"window_s must satisfy 0 <= start < end, got {window_s!r}")


def load_trace(
    spec: str,
    *,
    window_s: tuple[float, float] | None = None,
    rate_scale: float = 1.0,
    token_scale: float = 1.0,
    max_prompt_tokens: int | None = None,
    max_output_tokens: int | None = None,
    max_total_tokens: int | None = None,
    max_requests: int | None = None,
) -> list[TraceRequest]:
    """Read a trace and reshape it for replay.

    ``spec`` is a path (``.csv``/``.csv.gz``: Azure; ``.jsonl``/``.jsonl.gz``:
    Mooncake) or ``"synthetic-coding"`` (the trace shipped with loadgen).
    The steps, in order:

    1. ``window_s=(start, end)`` keeps requests with ``start <= t < end``,
       ``t`` in seconds since the first request of the file.
    2. ``max_requests`` keeps the first N of those.
    3. Arrivals are shifted so the first kept request is at 0, then divided
       by ``rate_scale`` (2.0 replays twice as many requests per second).
    4. Prompt and output tokens are multiplied by ``token_scale`` and
       rounded, at least 1 each (a trace row with 0 tokens becomes 1).
    5. Caps clip (never drop): prompt to ``max_prompt_tokens``, output to
       ``max_output_tokens``; then, if prompt + output exceeds
       ``max_total_tokens``, the prompt is clipped first (down to 1 token),
       then the output.

    ``hash_ids`` are kept as read, even when tokens are scaled or clipped.
    Raises ``TraceError`` for a malformed file, ``ValueError`` for bad
    options or when nothing is left after windowing, ``FileNotFoundError``.
    """
    options = TraceOptions(
        window_s=window_s,
        rate_scale=rate_scale,
        token_scale=token_scale,
        max_prompt_tokens=max_prompt_tokens,
        max_output_tokens=max_output_tokens,
        max_total_tokens=max_total_tokens,
        max_requests=max_requests,
    )
    requests = read_synthetic_coding() if spec == SYNTHETIC_CODING else read_trace(spec)
    if not requests:
        raise ValueError(f"trace {spec!r} holds no requests")
    reshaped = apply_options(requests, options)
    if not reshaped:
        duration_s = requests[-1].arrival_s
        raise ValueError(
            f"window_s={window_s!r} selects no requests from {spec!r} "
            f"({len(requests)} requests over {duration_s:.1f} s)"
        )
    return reshaped


def apply_options(requests: Sequence[TraceRequest], options: TraceOptions) -> list[TraceRequest]:
    """Window, truncate, rebase, rescale and cap ``requests`` (steps 1-5 of ``load_trace``)."""
    selected = list(requests)
    if options.window_s is not None:
        start, end = options.window_s
        selected = [r for r in selected if start <= r.arrival_s < end]
    if options.max_requests is not None:
        selected = selected[: options.max_requests]
    if not selected:
        return []
    origin_s = selected[0].arrival_s
    return [_reshape(r, origin_s, options) for r in selected]


def _reshape(request: TraceRequest, origin_s: float, options: TraceOptions) -> TraceRequest:
    prompt = max(1, round(request.prompt_tokens * options.token_scale))
    output = max(1, round(request.output_tokens * options.token_scale))
    if options.max_prompt_tokens is not None:
        prompt = min(prompt, options.max_prompt_tokens)
    if options.max_output_tokens is not None:
        output = min(output, options.max_output_tokens)
    if options.max_total_tokens is not None and prompt + output > options.max_total_tokens:
        # NOTE: the prompt gives way first: output lengths drive decode load, which
        # is what a replay is usually about; a prompt is never below 1 token.
        prompt = max(1, options.max_total_tokens - output)
        output = options.max_total_tokens - prompt
    arrival_s = (request.arrival_s - origin_s) / options.rate_scale
    return TraceRequest(arrival_s, prompt, output, request.hash_ids)
