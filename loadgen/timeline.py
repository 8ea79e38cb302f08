"""Device busy time and idle slices from a server's operator timeline.

slicegate's ``GET /admin/timeline?since=T`` lists recent operator executions
(device, op, request class, start, end; ``loadgen.probe.TimelinePoller``
moves them onto loadgen's ``time.monotonic()`` clock). From them: each device's busy fraction over a
window (the union of its op intervals / the window), busy fraction per time
bin, and its **idle slices** — the gaps between consecutive ops, the slices
that low-priority work could fill (the SliceScheduler paper's Figure 1).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from loadgen.stats import Distribution, distribution

_LIST_KEYS = ("timeline", "records", "ops", "events", "data")
_CLASS_KEYS = ("class", "request_class", "priority")


@dataclass(frozen=True, slots=True)
class OpSpan:
    """One operator execution on one device; times in seconds (monotonic clock)."""

    device: str
    start_s: float
    end_s: float
    op: str = ""
    request_class: str = ""
    cpu_s: float | None = None  # the executor thread's CPU time in it, where the server says


@dataclass(frozen=True, slots=True)
class DeviceUsage:
    """A device's use over a window."""

    device: str
    window_s: float
    busy_s: float
    num_ops: int
    idle_slices_s: tuple[float, ...]  # gaps between consecutive busy intervals, in time order

    @property
    def busy_fraction(self) -> float:
        return self.busy_s / self.window_s if self.window_s > 0 else 0.0

    def idle_distribution(self) -> Distribution:
        return distribution(self.idle_slices_s)


def parse_timeline(payload: Any) -> list[OpSpan]:
    """Op spans from a ``/admin/timeline`` JSON body (a list, or an object holding one)."""
    rows = payload
    if isinstance(payload, Mapping):
        rows = next((payload[k] for k in _LIST_KEYS if isinstance(payload.get(k), list)), None)
    if not isinstance(rows, list):
        raise ValueError(f"unexpected /admin/timeline body: {str(payload)[:200]}")
    spans = []
    for row in rows:
        try:
            start, end = float(row["start"]), float(row["end"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"timeline entry without numeric start/end: {row!r}") from None
        cls = next((str(row[k]) for k in _CLASS_KEYS if k in row), "")
        cpu = row.get("cpu")
        spans.append(OpSpan(str(row.get("device", "?")), start, end, str(row.get("op", "")), cls,
                            float(cpu) if isinstance(cpu, int | float) else None))
    return spans


def merge(spans: Iterable[OpSpan]) -> list[OpSpan]:
    """Unique spans (the poller may see one twice), sorted by (device, start, end)."""
    return sorted(set(spans), key=lambda s: (s.device, s.start_s, s.end_s, s.op))


def busy_intervals(spans: Iterable[OpSpan], start_s: float,
                   end_s: float) -> list[tuple[float, float]]:
    """The union of the spans' intervals clipped to [start_s, end_s], sorted and disjoint."""
    clipped = sorted((max(s.start_s, start_s), min(s.end_s, end_s)) for s in spans
                     if s.end_s > start_s and s.start_s < end_s)
    union: list[tuple[float, float]] = []
    for lo, hi in clipped:
        if union and lo <= union[-1][1]:
            union[-1] = (union[-1][0], max(union[-1][1], hi))
        else:
            union.append((lo, hi))
    return union


def device_usage(spans: Sequence[OpSpan], start_s: float, end_s: float) -> list[DeviceUsage]:
    """Busy time and idle slices per device over the window [start_s, end_s]."""
    out = []
    for device in sorted({s.device for s in spans}):
        mine = [s for s in spans if s.device == device]
        union = busy_intervals(mine, start_s, end_s)
        gaps = tuple(b[0] - a[1] for a, b in zip(union, union[1:], strict=False))
        num_ops = sum(1 for s in mine if s.end_s > start_s and s.start_s < end_s)
        out.append(DeviceUsage(device, end_s - start_s, sum(hi - lo for lo, hi in union),
                               num_ops, gaps))
    return out


def busy_over_time(spans: Sequence[OpSpan], start_s: float, end_s: float,
                   bin_s: float) -> dict[str, list[float]]:
    """Per device: the busy fraction of each ``bin_s`` bin from ``start_s`` (the last: partial)."""
    num_bins = max(1, math.ceil((end_s - start_s) / bin_s))
    out: dict[str, list[float]] = {}
    for device in sorted({s.device for s in spans}):
        bins = [0.0] * num_bins
        for lo, hi in busy_intervals([s for s in spans if s.device == device], start_s, end_s):
            _spread(bins, lo - start_s, hi - start_s, bin_s)
        widths = [min(bin_s, (end_s - start_s) - i * bin_s) for i in range(num_bins)]
        out[device] = [b / w if w > 0 else 0.0 for b, w in zip(bins, widths, strict=True)]
    return out


def _spread(bins: list[float], lo: float, hi: float, bin_s: float) -> None:
    """Add the interval [lo, hi) (seconds from the first bin's start) to the bins it covers."""
    i = int(lo // bin_s)
    while lo < hi and i < len(bins):
        edge = min(hi, (i + 1) * bin_s)
        bins[i] += edge - lo
        lo, i = edge, i + 1
