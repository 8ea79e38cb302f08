"""What ran beside each measured op on the other devices of its host.

An op measured while another device of its host was busy ran slower than alone;
the estimators learn solo times (the simulator applies the slowdown itself), so
each measured time is first brought back to its solo equivalent: during an
overlap with an op of class `b` it advanced at `1 / slowdown(a, b)`, so its solo
seconds are `duration - sum(overlap * (1 - 1 / slowdown(a, b)))` (exact with
one other device busy at a time, the fluid model of `executors.interference`;
an approximation when several overlap at once).

Ops are booked in batches, not in completion order across devices (but each
device's in its own order), so an op is resolved only once every other device
of its host has booked an op that ended after it (a device runs one op at a
time, so nothing overlapping it is missing), or once ops booked elsewhere ended
`settle_s` after it, or `flush(now)` is called `settle_s` after it (that device
was idle). Each resolved op also comes with the seconds it overlapped ops of each
class (`Resolved`), from which `scheduler.cost.colearn` learns the slowdowns online.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from executors.interference import Interference

HISTORY = 64  # intervals kept per device


@dataclass(frozen=True, slots=True)
class Interval:
    start: float
    end: float
    cls: int  # interference class index (-1: does not interfere)


@dataclass(frozen=True, slots=True)
class Resolved:
    item: object  # the caller's record of the op
    solo_s: float  # the seconds it would have taken alone on its host
    cls: int  # its interference class index (-1: does not interfere)
    overlap_s: tuple[float, ...]  # seconds it overlapped ops of each class on its host


class Overlaps:
    """Per device its recent op intervals; `add` returns the ops it can now resolve."""

    def __init__(self, inter: Interference, settle_s: float = 1.0) -> None:
        self.inter = inter
        self.settle_s = settle_s
        hosts: dict[str, list[str]] = {}
        for d, h in inter.hosts.items():
            hosts.setdefault(h, []).append(d)
        # device -> the other devices of its host (only hosts that devices share)
        self.others = {d: [o for o in ds if o != d] for ds in hosts.values() if len(ds) > 1
                       for d in ds}
        self.history: dict[str, deque[Interval]] = {d: deque(maxlen=HISTORY)
                                                     for d in self.others}
        self.last_end: dict[str, float] = {}
        self.latest = float("-inf")
        self._pending: list[tuple[str, str, Interval, object]] = []

    def shares(self, device: str) -> bool:
        return device in self.others

    def add(self, device: str, name: str, start: float, end: float, item: object
            ) -> list[Resolved]:
        """Record an op of `device` that ran over [start, end] (`item`: the caller's record
        of it); returns every op that can be resolved now."""
        iv = Interval(start, end, self.inter.class_index(name))
        if iv.cls >= 0:
            self.history[device].append(iv)
        self.last_end[device] = max(self.last_end.get(device, end), end)
        self.latest = max(self.latest, end)
        self._pending.append((device, name, iv, item))
        return self.flush(self.latest)

    def flush(self, now: float) -> list[Resolved]:
        """The ops that can be resolved at time `now`."""
        out, keep = [], []
        for p in self._pending:
            if self._resolvable(p[0], p[2], now):
                out.append(self.resolve(p[0], p[2], p[3]))
            else:
                keep.append(p)
        self._pending = keep
        return out

    def _resolvable(self, device: str, iv: Interval, now: float) -> bool:
        if now >= iv.end + self.settle_s:
            return True
        return all(self.last_end.get(o, float("-inf")) >= iv.end for o in self.others[device])

    def resolve(self, device: str, iv: Interval, item: object) -> Resolved:
        """`iv`'s overlaps with each class, and the seconds it would have taken alone."""
        seconds = iv.end - iv.start
        overlap = [0.0] * len(self.inter.classes)
        if iv.cls < 0:
            return Resolved(item, seconds, iv.cls, tuple(overlap))
        for o in self.others[device]:
            for other in reversed(self.history[o]):
                if other.end <= iv.start:
                    break
                ov = min(iv.end, other.end) - max(iv.start, other.start)
                if ov > 0 and other.cls >= 0:
                    overlap[other.cls] += ov
        excess = self.inter.excess[iv.cls]
        lost = sum(ov * (1.0 - 1.0 / (1.0 + e)) for ov, e in zip(overlap, excess, strict=True))
        return Resolved(item, max(seconds - lost, 0.0), iv.cls, tuple(overlap))
