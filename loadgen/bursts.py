"""`python -m loadgen bursts RUN...`: latency by how many requests arrived just before.

Reads each run folder's `requests.jsonl` (as `loadgen replay` and `bench` write it)
and prints, per run, TTFT grouped by the number of requests sent in the second up to
and including each one (itself counted), and the inter-token gaps of every stream. A
server that is as fast as another on a lone request but slower in bursts shows it here.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadgen.stats import percentile

GROUPS = ((1, 1), (2, 2), (3, 4), (5, None))  # arrivals in the window, inclusive bounds
WINDOW_S = 1.0


def load(run: Path) -> list[dict[str, Any]]:
    """The successful requests of a run folder (those with a first token)."""
    rows = [json.loads(line) for line in (run / "requests.jsonl").read_text().splitlines()
            if line.strip()]
    return [r for r in rows if r.get("first_token_s") is not None]


def burst_sizes(send_s: Sequence[float], window_s: float = WINDOW_S) -> list[int]:
    """For each send time: how many were sent in (t - window, t], itself included."""
    ordered = sorted(send_s)
    return [bisect.bisect_right(ordered, t) - bisect.bisect_right(ordered, t - window_s)
            for t in send_s]


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """TTFT p50 / max (ms) per burst group, and inter-token gap p50 / p90 / p99 (ms)."""
    sizes = burst_sizes([r["send_s"] for r in rows])
    groups = {}
    for lo, hi in GROUPS:
        ttft = [1e3 * (r["first_token_s"] - r["send_s"]) for r, n in zip(rows, sizes, strict=True)
                if n >= lo and (hi is None or n <= hi)]
        groups[f"{lo}" if lo == hi else f"{lo}-{hi}" if hi else f"{lo}+"] = {
            "requests": len(ttft), "ttft_p50_ms": percentile(ttft, 50),
            "ttft_max_ms": max(ttft, default=None)}
    gaps = [1e3 * (b - a) for r in rows for a, b in itertools.pairwise(r.get("token_s") or [])]
    return {"requests": len(rows), "by_burst": groups,
            "gap_ms": {f"p{q}": percentile(gaps, q) for q in (50, 90, 99)}}


def markdown(summaries: dict[str, dict[str, Any]]) -> str:
    heads = [f"TTFT p50 ms, {k} in 1 s (n)" for k in next(iter(summaries.values()))["by_burst"]]
    lines = ["| run | " + " | ".join(heads) + " | gap p50 / p90 / p99 ms |",
             "|---|" + "---:|" * (len(heads) + 1)]
    for name, s in summaries.items():
        cells = [f"{_ms(g['ttft_p50_ms'])} ({g['requests']})" for g in s["by_burst"].values()]
        gap = " / ".join(_ms(v) for v in s["gap_ms"].values())
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {gap} |")
    return "\n".join(lines)


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v:.0f}"


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", type=Path,
                   help="run folders holding requests.jsonl (e.g. bench-results/X/runs/slice)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
    summaries = {}
    for folder in args.runs:
        if not (folder / "requests.jsonl").is_file():
            raise ValueError(f"{folder}: no requests.jsonl (a loadgen run folder)")
        summaries[f"{folder.parent.parent.name}/{folder.name}"] = summarize(load(folder))
    print(json.dumps(summaries, indent=2) if args.json else markdown(summaries))
    return 0
