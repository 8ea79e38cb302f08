"""Trace statistics: size, rate, burstiness, token percentiles; a Markdown table of them.

``python -m loadgen.tracestats SPEC...`` prints the table (stdlib only, like
``loadgen.traces``).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from loadgen.traces import SYNTHETIC_CODING, TraceRequest, load_trace


@dataclass(frozen=True, slots=True)
class TraceStats:
    """Summary of a trace: size, rate, burstiness and token percentiles."""

    num_requests: int
    duration_s: float  # last arrival - first arrival
    requests_per_s: float  # num_requests / duration_s (0 when the duration is 0)
    interarrival_cov: float  # std / mean of the gaps; 1 for Poisson arrivals, higher is burstier
    prompt_tokens_mean: float
    prompt_tokens_p50: float
    prompt_tokens_p90: float
    prompt_tokens_p99: float
    output_tokens_mean: float
    output_tokens_p50: float
    output_tokens_p90: float
    output_tokens_p99: float


def trace_stats(requests: Sequence[TraceRequest]) -> TraceStats:
    """Compute ``TraceStats`` (percentiles interpolate linearly; all zero for an empty trace)."""
    arrivals = [r.arrival_s for r in requests]
    duration_s = arrivals[-1] - arrivals[0] if arrivals else 0.0
    prompts = sorted(r.prompt_tokens for r in requests)
    outputs = sorted(r.output_tokens for r in requests)
    return TraceStats(
        num_requests=len(requests),
        duration_s=duration_s,
        requests_per_s=len(requests) / duration_s if duration_s > 0 else 0.0,
        interarrival_cov=_cov([b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]),
        prompt_tokens_mean=_mean(prompts),
        prompt_tokens_p50=_percentile(prompts, 50),
        prompt_tokens_p90=_percentile(prompts, 90),
        prompt_tokens_p99=_percentile(prompts, 99),
        output_tokens_mean=_mean(outputs),
        output_tokens_p50=_percentile(outputs, 50),
        output_tokens_p90=_percentile(outputs, 90),
        output_tokens_p99=_percentile(outputs, 99),
    )


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _cov(values: Sequence[float]) -> float:
    mean = _mean(values)
    if mean <= 0:
        return 0.0
    variance = _mean([(v - mean) ** 2 for v in values])
    return math.sqrt(variance) / mean


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    position = (len(sorted_values) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def format_stats_table(stats: Mapping[str, TraceStats]) -> str:
    """A Markdown table of several traces' stats, one row per trace."""
    header = (
        "| trace | requests | duration s | req/s | gap CoV | prompt p50 / p90 / p99 (mean) "
        "| output p50 / p90 / p99 (mean) |"
    )
    lines = [header, "|---|---:|---:|---:|---:|---:|---:|"]
    for name, s in stats.items():
        lines.append(
            f"| {name} | {s.num_requests} | {s.duration_s:.1f} | {s.requests_per_s:.2f} "
            f"| {s.interarrival_cov:.2f} "
            f"| {s.prompt_tokens_p50:.0f} / {s.prompt_tokens_p90:.0f} / {s.prompt_tokens_p99:.0f}"
            f" ({s.prompt_tokens_mean:.0f}) "
            f"| {s.output_tokens_p50:.0f} / {s.output_tokens_p90:.0f} / {s.output_tokens_p99:.0f}"
            f" ({s.output_tokens_mean:.0f}) |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m loadgen.tracestats SPEC...``: print a stats table of each trace."""
    parser = argparse.ArgumentParser(
        prog="python -m loadgen.tracestats",
        description="Print each trace's request count, duration, rate, burstiness (CoV of the "
                    "gaps between arrivals) and prompt and output token percentiles.")
    parser.add_argument("specs", nargs="*", metavar="TRACE",
                        help=f"a .csv[.gz] (Azure) or .jsonl[.gz] (Mooncake) file, or "
                             f"{SYNTHETIC_CODING} (the default)")
    specs = parser.parse_args(argv).specs or [SYNTHETIC_CODING]
    try:
        stats = {spec: trace_stats(load_trace(spec)) for spec in specs}
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_stats_table(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
