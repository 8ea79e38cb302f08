"""Fair share within a class: a virtual token counter per tenant (VTC).

Every tenant of a class has a counter of the service it received: each token fed
through the model counts 1, each token generated 1 more (VTC's weights, output costing
twice an input). Policies admit the waiting requests of a class in the order of their
tenants' counters (`scheduler.policies.common.fair_order`), so a tenant that floods its
class is served as much as each other tenant of the class, not in proportion to what it
sends. A tenant that comes back after its queue ran empty has its counter lifted to the
least counter among the tenants still waiting in its class, so that idling earns no
credit (VTC's counter lift).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from executors.types import Priority


class FairShare:
    """Per-class virtual counters (`counters`) and raw service (`served`), both in tokens."""

    def __init__(self) -> None:
        self.counters: dict[Priority, dict[str, float]] = defaultdict(dict)
        self.served: dict[Priority, dict[str, float]] = defaultdict(dict)

    def on_arrival(self, priority: Priority, tenant: str, backlogged: Iterable[str]) -> None:
        """A request of `tenant` arrives while `backlogged` tenants have requests waiting in
        `priority`'s queue (lift the counter of a tenant that was not among them)."""
        counters = self.counters[priority]
        waiting = set(backlogged)
        own = counters.get(tenant, 0.0)
        if tenant not in waiting:
            others = [counters.get(t, 0.0) for t in waiting]
            own = max(own, min(others)) if others else own
        counters[tenant] = own
        self.served[priority].setdefault(tenant, 0.0)

    def charge(self, priority: Priority, tenant: str, tokens: float) -> None:
        counters, served = self.counters[priority], self.served[priority]
        counters[tenant] = counters.get(tenant, 0.0) + tokens
        served[tenant] = served.get(tenant, 0.0) + tokens

    def view(self) -> dict[Priority, dict[str, float]]:
        """A copy of the counters, for a round's view."""
        return {p: dict(c) for p, c in self.counters.items()}

    def jain(self) -> dict[str, float]:
        """Jain's fairness index of the service each tenant of a class received (class label
        -> index in (0, 1]; 1 when all got the same), for classes with 2+ tenants."""
        return {p.label: jain_index(s.values()) for p, s in self.served.items() if len(s) > 1}


def jain_index(values: Iterable[float]) -> float:
    """(sum x)^2 / (n * sum x^2); 1.0 for no values or all zero."""
    xs = list(values)
    square = sum(x * x for x in xs)
    return 1.0 if not xs or square == 0 else sum(xs) ** 2 / (len(xs) * square)


def counter_of(service: Mapping[Priority, Mapping[str, float]], priority: Priority,
               tenant: str) -> float:
    return service.get(priority, {}).get(tenant, 0.0)
