"""What every bench shares: the machine line printed beside its figures, the `--json`
flag and the file it writes, its markdown tables, a median of timed repeats, and the
`python -m benchmarks.<package> NAME` dispatch."""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from models.cpu import cpu_caps

STDOUT = Path("-")  # `--json` without a file, or `--json -`: the JSON goes to stdout

Bench = Callable[[list[str] | None], object]  # a bench's `main(argv)`


def capability_line() -> str:
    """The CPU's capability line (`models.cpu`: which instruction sets its kernels could use),
    e.g. `Intel(R) Xeon(R) Processor, 2 CPUs: AMX yes, AVX512-BF16 yes, AVX512 yes, AVX2
    yes; torch 2.13.0 dispatches AVX512`."""
    return cpu_caps().line()


def load_average() -> tuple[float, float, float] | None:
    try:
        return os.getloadavg()
    except OSError:
        return None


def machine_line() -> str:
    """The capability line and the 1/5/15-minute load average, for a bench's header."""
    load = load_average()
    avg = "n/a" if load is None else " / ".join(f"{x:.2f}" for x in load)
    return f"machine: {capability_line()}; load average {avg}"


def machine() -> dict[str, object]:
    """The machine as a bench's JSON records it."""
    return {"machine": capability_line(), "load_avg": load_average()}


def parser(prog: str, doc: str | None = None) -> argparse.ArgumentParser:
    """A bench's argument parser (described by its docstring's first paragraph), with `--json`."""
    summary = " ".join(doc.split("\n\n")[0].split()) if doc else None
    p = argparse.ArgumentParser(prog=prog, description=summary)
    p.add_argument("--json", type=Path, nargs="?", const=STDOUT, default=None, metavar="FILE",
                   help="write the result as JSON to FILE (or stdout without one)")
    return p


def write_json(path: Path | None, result: object) -> None:
    """The result to `path` (`STDOUT`: printed), if a path was given."""
    if path is None:
        return
    text = json.dumps(result, indent=1)
    if path == STDOUT:
        print(text)
    else:
        path.write_text(text)


def print_table(header: Sequence[str], align: str, rows: Iterable[Sequence[object]]) -> None:
    """A markdown table; `align` has a letter per column: `l` (text) or `r` (figures)."""
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---:" if a == "r" else "---" for a in align) + "|")
    for row in rows:
        print("| " + " | ".join(str(c) for c in row) + " |")


def median_s(fn: Callable[[], object], repeats: int) -> float:
    """Median wall seconds of `repeats` calls of `fn` (any warm-up is the caller's)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def dispatch(prog: str, benches: dict[str, Bench], argv: list[str] | None = None,
             errors: tuple[type[Exception], ...] = (FileNotFoundError,)) -> None:
    """`prog NAME [flags]`: bench NAME's `main` with the flags. One of `errors` (a model or a
    public trace that is not here) ends the run with its message instead of a traceback."""
    args = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    if not args or args[0] not in benches:
        sys.exit(f"usage: {prog} {{{'|'.join(benches)}}} [--json FILE] ...\n"
                 f"       {prog} NAME --help")
    try:
        benches[args[0]](args[1:])
    except errors as exc:
        sys.exit(f"error: {exc}")
