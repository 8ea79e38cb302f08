"""Slowdown of ops that run at once on devices sharing a host (a co-location model).

Pairwise, as OpScale's: `slowdown[(a, b)]` is how much longer an op of class `a`
takes while another device of its host runs an op of class `b` (1.0: no effect).
With several other devices busy, the excesses add: `1 + sum(slowdown[(a, b)] - 1)`
over the ops running on the other devices of the host.

Progress is fluid: an op advances at `1 / slowdown` of its solo speed, and its
slowdown is re-evaluated whenever the classes running on its host change. Its
remaining work is kept in solo seconds; `settle` advances it to a new time and
`finish_at` gives the completion under the current slowdown. The fake
executors (`executors.fake`) and the simulator (`scheduler.sim.simulator`) both
apply this module, with the same arithmetic in the same order, so they agree
exactly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

OP_CLASSES = ("embed", "layers", "head", "send")  # what interferes; RECVs and others do not


def op_class(name: str) -> str | None:
    """The interference class of an op name: a layer group is `layers`; a RECV is none.
    A model set's op (`NAME/head`) is of its op's class."""
    name = name.rpartition("/")[2]
    if name.startswith("layers["):
        return "layers"
    return name if name in OP_CLASSES else None


class Interference:
    """Which devices share a host, and the pairwise slowdown of op classes on one host.

    `hosts` maps a device name to its host; a device absent from it (or alone on its
    host) runs at solo speed whatever else runs. Factors are clamped to at least 1.
    """

    def __init__(self, hosts: Mapping[str, str],
                 slowdown: Mapping[tuple[str, str], float]) -> None:
        self.hosts = dict(hosts)
        self.slowdown = {k: max(1.0, float(v)) for k, v in slowdown.items()}
        self.classes = OP_CLASSES
        # excess[a][b] = slowdown(a | b) - 1, by class index
        self.excess = tuple(tuple(self.slowdown.get((a, b), 1.0) - 1.0 for b in OP_CLASSES)
                            for a in OP_CLASSES)
        self._index: dict[str, int] = {}
        self._neutral = all(e == 0.0 for row in self.excess for e in row)
        self._tables: dict[int, dict[int, list[float]]] = {}  # base -> code -> `factors`
        # NOTE: what its users derive from the model once (the simulator: its view of the
        # hosts of a list of devices), kept as long as the model: rounds share it
        self.memo: dict[Any, Any] = {}

    def class_index(self, name: str) -> int:
        """Index of `name`'s class in `classes`, -1 for an op that does not interfere."""
        i = self._index.get(name)
        if i is None:
            c = op_class(name)
            i = self._index[name] = OP_CLASSES.index(c) if c is not None else -1
        return i

    def class_indices(self, names: Sequence[str]) -> list[int]:
        """`class_index` of each name (one dict lookup each once the names were seen)."""
        get = self._index.get
        out = [get(n, -2) for n in names]
        if -2 in out:
            out = [self.class_index(n) for n in names]
        return out

    def factor(self, cls: int, counts: Sequence[int]) -> float:
        """Slowdown of an op of class index `cls` on a host running `counts[c]` ops of each
        class (the op itself included)."""
        if cls < 0:
            return 1.0
        row = self.excess[cls]
        s = 1.0
        for c, n in enumerate(counts):
            if n:
                s += row[c] * (n - 1 if c == cls else n)
        return s

    def factor_table(self, base: int) -> dict[int, list[float]]:
        """The cache of `factors` for one `base` (filled by `factors`; read it first)."""
        return self._tables.setdefault(base, {})

    def factors(self, base: int, code: int) -> list[float]:
        """Slowdown per class index (`factor`), then 1.0 (for index -1), on a host whose
        running ops are counted in `code`: the count of class `c` is its base-`base` digit
        `c`. Cached: a simulation meets few codes, and every round meets the same ones."""
        table = self.factor_table(base)
        fac = table.get(code)
        if fac is None:
            n = len(self.classes)
            counts = [code // base ** k % base for k in range(n)]
            fac = table[code] = [self.factor(k, counts) for k in range(n)] + [1.0]
        return fac

    def sharing(self, devices: Sequence[str]) -> list[int]:
        """Host index per device (first appearance order) for hosts that two or more of
        `devices` share; -1 for a device alone on its host or of unknown host."""
        host = [self.hosts.get(d) for d in devices]
        shared = {h for h in host if h is not None and host.count(h) > 1}
        order: dict[str, int] = {}
        return [order.setdefault(h, len(order)) if h in shared else -1 for h in host]

    def with_hosts(self, hosts: Mapping[str, str]) -> Interference:
        """The same slowdowns for another set of devices."""
        return Interference(hosts, self.slowdown)

    def is_neutral(self) -> bool:
        """Whether no factor slows anything (then nothing needs the fluid model)."""
        return self._neutral

    def to_dict(self) -> dict[str, Any]:
        return {"hosts": self.hosts,
                "slowdown": [[a, b, s] for (a, b), s in sorted(self.slowdown.items())]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Interference:
        return cls(d["hosts"], {(a, b): s for a, b, s in d["slowdown"]})

    def __repr__(self) -> str:
        busy = {f"{a}|{b}": round(s, 3) for (a, b), s in self.slowdown.items() if s > 1.0}
        return f"Interference(hosts={self.hosts}, slowdown={busy})"


def settle(rem_s: float, last: float, slow: float, now: float) -> float:
    """Solo seconds left at `now` of an op that had `rem_s` left at `last`, run since at
    `1 / slow` of its solo speed (never below zero)."""
    left = rem_s - (now - last) / slow
    return left if left > 0.0 else 0.0


def finish_at(now: float, rem_s: float, slow: float) -> float:
    """When an op with `rem_s` solo seconds left at `now` ends at slowdown `slow`."""
    return now + rem_s * slow
