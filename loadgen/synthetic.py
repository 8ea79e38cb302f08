"""Generator of the synthetic coding trace shipped as ``loadgen/data/synthetic_coding.csv``.

Shaped like the Azure LLM inference code trace (2023), which it does not copy:

- Arrivals: a Markov-modulated Poisson process that switches between *on*
  (exponential length, mean ``ON_MEAN_S``) and silent *off* periods (mean
  ``OFF_MEAN_S``); each on period draws its own intensity from an
  exponential distribution. The intensities are then scaled so that the
  expected number of requests is ``mean_rate * duration_s`` for the drawn
  schedule, so the realized rate stays close to ``mean_rate`` (Poisson
  noise only) while arrivals come in bursts separated by idle gaps.
- Prompt tokens: lognormal, median ``PROMPT_MEDIAN``, capped at ``PROMPT_MAX``.
- Output tokens: ``OUTPUT_MIN - 1`` + lognormal, median ``OUTPUT_MEDIAN``
  overall, capped at ``OUTPUT_MAX``; independent of the prompt.

Times are whole ticks of 100 ns (the precision of the Azure TIMESTAMP) and
are summed as integers, so a seed gives the same file everywhere.
Stdlib only, like ``loadgen.traces``.

    python -m loadgen.synthetic > loadgen/data/synthetic_coding.csv
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from collections.abc import Sequence
from datetime import datetime

from loadgen.traces import TraceRequest, write_azure_csv

DEFAULT_SEED = 0
DEFAULT_DURATION_S = 600.0
DEFAULT_MEAN_RATE = 3.0  # requests per second, averaged over on and off periods
START = datetime(2024, 1, 1)  # wall-clock time of the first request in the written CSV

ON_MEAN_S = 20.0
OFF_MEAN_S = 40.0
PROMPT_MEDIAN = 1500
PROMPT_SIGMA = 0.95  # of ln(tokens)
PROMPT_MAX = 8000
OUTPUT_MIN = 6
OUTPUT_MEDIAN = 13
OUTPUT_SIGMA = 1.45  # of ln(tokens - OUTPUT_MIN + 1)
OUTPUT_MAX = 500

_TICKS_PER_S = 10_000_000


def generate(
    seed: int = DEFAULT_SEED,
    duration_s: float = DEFAULT_DURATION_S,
    mean_rate: float = DEFAULT_MEAN_RATE,
) -> list[TraceRequest]:
    """Generate the synthetic coding trace; the same arguments always give the same list.

    Arrivals lie in ``[0, duration_s)`` and the first one is at 0.
    """
    if not (math.isfinite(duration_s) and duration_s > 0):
        raise ValueError(f"duration_s must be a finite number > 0, got {duration_s!r}")
    if not (math.isfinite(mean_rate) and mean_rate > 0):
        raise ValueError(f"mean_rate must be a finite number > 0, got {mean_rate!r}")
    # NOTE: separate streams, so a change to one distribution leaves the others' draws alone.
    arrival_rng = random.Random(f"slicegate-synthetic-coding/{seed}/arrivals")
    token_rng = random.Random(f"slicegate-synthetic-coding/{seed}/tokens")
    total_ticks = max(1, round(duration_s * _TICKS_PER_S))
    ticks = _arrival_ticks(arrival_rng, total_ticks, mean_rate)
    origin = ticks[0] if ticks else 0
    return [
        TraceRequest(
            arrival_s=(t - origin) / _TICKS_PER_S,
            prompt_tokens=_prompt_tokens(token_rng),
            output_tokens=_output_tokens(token_rng),
        )
        for t in ticks
    ]


def _schedule(rng: random.Random, total_ticks: int) -> list[tuple[int, int, float]]:
    """On periods as ``(start_tick, end_tick, relative intensity)``, starting with one at 0."""
    periods = []
    start, on = 0, True
    while start < total_ticks:
        mean_s = ON_MEAN_S if on else OFF_MEAN_S
        end = min(total_ticks, start + 1 + round(rng.expovariate(1 / mean_s) * _TICKS_PER_S))
        if on:
            periods.append((start, end, rng.expovariate(1.0)))
        start, on = end, not on
    return periods


def _arrival_ticks(rng: random.Random, total_ticks: int, mean_rate: float) -> list[int]:
    periods = _schedule(rng, total_ticks)
    weighted_s = sum((end - start) * weight for start, end, weight in periods) / _TICKS_PER_S
    expected = mean_rate * total_ticks / _TICKS_PER_S
    ticks: list[int] = []
    for start, end, weight in periods:
        if weight <= 0:
            continue
        rate = weight * expected / weighted_s  # requests per second in this on period
        t = start
        while True:
            t += round(rng.expovariate(rate) * _TICKS_PER_S)
            if t >= end:
                break
            ticks.append(t)
    return ticks


def _prompt_tokens(rng: random.Random) -> int:
    tokens = round(rng.lognormvariate(math.log(PROMPT_MEDIAN), PROMPT_SIGMA))
    return min(PROMPT_MAX, max(1, tokens))


def _output_tokens(rng: random.Random) -> int:
    above = rng.lognormvariate(math.log(OUTPUT_MEDIAN - OUTPUT_MIN + 1), OUTPUT_SIGMA)
    return min(OUTPUT_MAX, OUTPUT_MIN - 1 + max(1, round(above)))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m loadgen.synthetic [--seed N] [--duration-s S] [--mean-rate R]`` > FILE."""
    parser = argparse.ArgumentParser(
        prog="python -m loadgen.synthetic",
        description="Write the synthetic coding trace as Azure-format CSV to stdout.",
    )
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--duration-s", type=float, default=DEFAULT_DURATION_S)
    parser.add_argument("--mean-rate", type=float, default=DEFAULT_MEAN_RATE, help="requests/s")
    args = parser.parse_args(argv)
    try:
        requests = generate(args.seed, args.duration_s, args.mean_rate)
    except ValueError as exc:
        parser.error(str(exc))
    write_azure_csv(requests, sys.stdout, start=START)
    return 0


if __name__ == "__main__":
    sys.exit(main())
