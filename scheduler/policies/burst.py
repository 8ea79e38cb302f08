"""A burst of waiting prefills of one class: the order and the spread that keep most deadlines.

Placed one by one in deadline order, each at its own earliest first token, the
head of a burst of long prompts takes both devices (a chunked pipeline over a
layer split) and every prompt after it waits for the whole pipeline: with two
devices and three 450-token prompts under a 500 ms SLO, the second and third
start too late. One prompt per device, or the shortest first, keeps more of
them. `burst_schedule` chooses, for a few waiting requests, the order and each
one's spread (one device, or a pipeline over two) that maximise the number of
first tokens within their deadlines, then minimise the sum of first-token
times (so, among the requests that can still make it, the shortest goes
first; one that cannot make it anyway goes after those that can). It is a pure
function of each request's predicted prefill seconds; `slice` predicts them by
simulation (`SlicePolicy._burst`) and places the burst's head with its spread.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

T = TypeVar("T")

MAX_BURST = 4  # requests ordered by enumeration (4! orders x 2^4 spreads); the rest after


class Spread(Enum):
    """How a request of a burst is placed: on one device, or as a pipeline over two."""

    ONE = "one"
    SPLIT = "split"


@dataclass(frozen=True, slots=True)
class BurstJob:
    """One waiting prefill: the seconds to its deadline and its prefill's predicted seconds
    on one device and as a pipeline over two (None: not split, e.g. a short prompt)."""

    rid: str
    slack_s: float  # its TTFT deadline minus now
    one_s: float
    split_s: float | None

    def __post_init__(self) -> None:
        if self.one_s < 0 or (self.split_s is not None and self.split_s < 0):
            raise ValueError(f"{self.rid}: prefill seconds must be >= 0")

    def spreads(self) -> tuple[Spread, ...]:
        return (Spread.ONE,) if self.split_s is None else (Spread.ONE, Spread.SPLIT)


@dataclass(frozen=True, slots=True)
class BurstSchedule:
    """The chosen order (first to place first) with each request's spread, and how many of
    them the schedule predicts within their deadlines."""

    order: tuple[tuple[str, Spread], ...]
    num_on_time: int


def burst_schedule(jobs: list[BurstJob], num_devices: int) -> BurstSchedule:
    """The order and spreads of `jobs` that maximise the first tokens within their deadlines
    on `num_devices` devices free now, then minimise the sum of first-token times; ties
    keep the given order (deadline, then arrival). Only the first `MAX_BURST` jobs are
    enumerated; later ones follow in the given order, on one device each.

    NOTE: a list schedule: a request on one device starts when the first device frees, a
    pipeline when the first two do, and holds both until its end."""
    if num_devices < 1:
        raise ValueError(f"num_devices must be >= 1, got {num_devices}")
    head, rest = jobs[:MAX_BURST], jobs[MAX_BURST:]
    best: tuple[tuple[int, float], tuple[tuple[BurstJob, Spread], ...]] | None = None
    for perm in itertools.permutations(head):
        for spreads in itertools.product(*(j.spreads() for j in perm)):
            pairs = tuple(zip(perm, spreads, strict=True))
            key = _cost([*pairs, *((j, Spread.ONE) for j in rest)], num_devices)
            if best is None or key < best[0]:
                best = (key, pairs)
    assert best is not None or not jobs
    pairs = best[1] if best is not None else ()
    chosen = tuple((j.rid, s) for j, s in (*pairs, *((j, Spread.ONE) for j in rest)))
    return BurstSchedule(chosen, -best[0][0] if best is not None else 0)


def _cost(pairs: list[tuple[BurstJob, Spread]], num_devices: int) -> tuple[int, float]:
    """(-first tokens within their deadlines, sum of first-token times) of the list schedule
    of `pairs` in their order."""
    free = [0.0] * num_devices
    on_time, total = 0, 0.0
    for job, spread in pairs:
        free.sort()
        if spread is Spread.SPLIT and num_devices > 1:
            assert job.split_s is not None
            end = free[1] + job.split_s
            free[0] = free[1] = end
        else:
            end = free[0] + job.one_s
            free[0] = end
        on_time += end <= job.slack_s
        total += end
    return -on_time, total


def in_burst_order(items: list[T], order: list[str], rid: Callable[[T], str]) -> list[T]:
    """`items` with those whose `rid` is named in `order` put in that order, in the places
    they held; the others keep theirs."""
    by_rid = {rid(x): x for x in items}
    burst = iter([by_rid[r] for r in order])
    named = set(order)
    return [next(burst) if rid(x) in named else x for x in items]
