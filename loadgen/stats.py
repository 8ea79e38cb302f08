"""Percentiles and distributions for reports (linear interpolation, like numpy's default)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass


def percentile(values: Iterable[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) with linear interpolation; None for no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True, slots=True)
class Distribution:
    """Summary of a sample; every figure is None when the sample is empty."""

    count: int
    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None
    max: float | None

    def to_json(self) -> dict[str, float | int | None]:
        return asdict(self)


def distribution(values: Sequence[float]) -> Distribution:
    """Count, mean, p50/p90/p99 and max of ``values``."""
    if not values:
        return Distribution(0, None, None, None, None, None)
    return Distribution(
        count=len(values),
        mean=sum(values) / len(values),
        p50=percentile(values, 50),
        p90=percentile(values, 90),
        p99=percentile(values, 99),
        max=max(values),
    )


def cdf(values: Iterable[float]) -> tuple[list[float], list[float]]:
    """Sorted values and their empirical CDF (i / n for the i-th smallest, 1-based)."""
    ordered = sorted(values)
    n = len(ordered)
    return ordered, [(i + 1) / n for i in range(n)]


def median_interval(values: Iterable[float], z: float = 1.96) -> tuple[float, float] | None:
    """A distribution-free confidence interval of the median (95% at the default ``z``):
    the order statistics at 1-based ranks floor(n/2 - z*sqrt(n)/2) and
    ceil(1 + n/2 + z*sqrt(n)/2) (the binomial's normal approximation), clipped to the
    sample; None for fewer than 2 values."""
    ordered = sorted(values)
    n = len(ordered)
    if n < 2:
        return None
    half = z * math.sqrt(n) / 2
    low = max(0, math.floor(n / 2 - half) - 1)
    high = min(n - 1, math.ceil(1 + n / 2 + half) - 1)
    return ordered[low], ordered[high]
