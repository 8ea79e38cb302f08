"""M/M/c queueing: Erlang C, mean waiting time, and the replica counts a provisioner needs.

`a` is the offered load in Erlangs (arrivals per second x mean service seconds);
`c` the number of servers (replicas of one operator).
"""

from __future__ import annotations

import math


def erlang_c(c: int, a: float) -> float:
    """Probability that an arrival waits (all `c` servers busy); 1 when the queue is unstable."""
    if a <= 0:
        return 0.0
    if c <= a:
        return 1.0
    b = 1.0  # Erlang B by its recursion B(k) = a B(k-1) / (k + a B(k-1)): no factorials
    for k in range(1, c + 1):
        b = a * b / (k + a * b)
    rho = a / c
    return b / (1 - rho + rho * b)


def mean_wait_s(c: int, arrivals_per_s: float, service_s: float) -> float:
    """Mean time in queue before service (inf when unstable)."""
    a = arrivals_per_s * service_s
    if a <= 0:
        return 0.0
    if c <= a:
        return math.inf
    return erlang_c(c, a) * service_s / (c - a)


def min_stable(arrivals_per_s: float, service_s: float) -> int:
    """The fewest servers that keep the queue stable (utilisation < 1); at least 1."""
    a = arrivals_per_s * service_s
    return max(1, math.floor(a) + 1)


def replicas_for(arrivals_per_s: float, service_s: float, wait_budget_s: float,
                 max_replicas: int) -> int:
    """The fewest servers (from the stable minimum up to `max_replicas`) whose mean Erlang-C
    wait is within `wait_budget_s`; `max_replicas` when none is.

    NOTE: Erlang B is carried from one count to the next, so the search is linear in the
    count (the provisioner runs it for every operator every second)."""
    a = arrivals_per_s * service_s
    first = min(min_stable(arrivals_per_s, service_s), max_replicas)
    if a <= 0:
        return first
    b = 1.0
    for c in range(1, max_replicas + 1):
        b = a * b / (c + a * b)
        if c < first:
            continue
        rho = a / c
        if rho < 1 and b / (1 - rho + rho * b) * service_s / (c - a) <= wait_budget_s:
            return c
    return max_replicas
