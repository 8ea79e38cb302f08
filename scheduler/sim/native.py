"""The simulator's event loop in C (`scheduler/sim/csrc/simloop.c`), built once per machine and
called via ctypes.

`scheduler.sim.simulator` runs it in place of its Python loops wherever it could be built:
the same steps on the same columns, so the two predict the same times to the last bit
(`tests/scheduler/sim/test_simulator_reference.py` holds both to the reference on random
snapshots, `test_simulator.py` to the fake executors, `test_simloop.py` on the graphs
this module builds its own way). The
library is built by `models.native.load_library` with `-ffp-contract=off`, so no multiply-add
is fused, and without `-march=native`: a scalar loop gains nothing from wider vectors.
Where no C compiler works, `library()` is None, `note()` says why (logged once) and the
simulator stays in Python.
"""

from __future__ import annotations

import ctypes
import functools
from array import array
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, chain, compress, repeat
from operator import is_not
from pathlib import Path
from typing import Any

from executors.interference import Interference
from models.native import load_library
from scheduler.sim.gmg import SimOp

_SOURCE = Path(__file__).parent / "csrc" / "simloop.c"
FLAGS = ("-O2", "-fPIC", "-shared", "-std=c11", "-ffp-contract=off")
_ARGS: list[Any] = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_double, ctypes.c_void_p]


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    lib.sim_run_packed.argtypes, lib.sim_run_packed.restype = _ARGS, ctypes.c_int64
    return lib


@functools.cache
def _load() -> tuple[ctypes.CDLL | None, str, str]:
    return load_library("simloop", [_SOURCE], FLAGS, _bind,
                        "the simulator's C loop (the Python loops run instead) is")


def library() -> ctypes.CDLL | None:
    """The loop built for this machine, or None where it cannot be built."""
    return _load()[0]


def note() -> str:
    """Whether the C loop is on here: where its library is, or why it is off."""
    return _load()[1]


@dataclass(slots=True)
class Graph:
    """The ops of a snapshot plus a candidate as the C loop reads them: op i is `ops[i]`;
    per op its device index, dispatch key columns (priority, issued at, op id: the
    simulator's `keys` without the position), estimate, activation bytes and deps (op
    ids, `dep_ids[dep_ptr[i]:dep_ptr[i + 1]]`; ops before `scope` look for theirs among
    themselves); the ops running in the snapshot with their starts. Read-only once built:
    a snapshot's own graph is cached on it and extended by each candidate, as the Python
    loops' graph is."""

    ops: list[SimOp]
    ids: list[int]
    id_set: set[int] | None  # of a built graph (`extend` extends only those); else None
    names: list[str]  # the snapshot's devices
    devices: list[str]  # the snapshot's devices, then any others (sorted)
    where: dict[str, int]  # device -> index
    dev: array
    pr: array
    issued: array
    oid: array
    dur: array
    mem_of: array
    dep_ptr: array
    dep_ids: array
    scope: int
    running: array
    run_start: array
    firsts: dict[int, tuple[str, ...]]  # op -> requests whose first token it produces
    cls: array | None = None  # op -> interference class index (filled by `classes`)


def build(names: list[str], ops: list[SimOp], issued: Sequence[float]) -> Graph:
    """The graph of `ops` on a snapshot's devices `names`; `issued`: each op's key time.

    NOTE: the key columns are `executors.dispatch.dispatch_key`'s (priority, issued at, op
    id), inlined as `scheduler.sim.graph.build` inlines it (a SimOp's issued_at is never
    None); the loop compares them in that order, then by position."""
    n = len(ops)
    ids, _, on, prio, deps, est, _, starts, mem_of, fto, _ = (
        zip(*ops, strict=True) if ops else ((),) * 11)
    devices = names + sorted(set(on) - set(names))
    where = {d: k for k, d in enumerate(devices)}
    running = list(compress(range(n), map(is_not, starts, repeat(None))))
    return Graph(ops, list(ids), set(ids), names, devices, where,
                 array("i", [where[d] for d in on]),
                 array("i", prio), array("d", issued), array("q", ids), array("d", est),
                 array("q", mem_of),
                 array("i", list(accumulate(map(len, deps), initial=0))),
                 array("q", list(chain.from_iterable(deps))), n, array("i", running),
                 array("d", [starts[i] for i in running]), dict(compress(enumerate(fto), fto)))


def extend(base: Graph, new: tuple[SimOp, ...], now: float,
           inter: Interference | None = None) -> Graph:
    """`base` with a candidate's ops `new`, issued at `now`; built afresh where they run on
    a device `base` lacks. Where they reuse an op id of `base`, every op looks for its deps
    among all (as the Python loops' graph, built afresh then). `inter`: the class indices
    too, where `base` has its own (`classes`)."""
    n0, m = len(base.ops), len(new)
    ids, names, on, prio, deps, est, _, starts, mem_of, fto, _ = zip(*new, strict=True)
    if not base.where.keys() >= set(on):
        return build(base.names, [*base.ops, *new], [*base.issued, *repeat(now, m)])
    assert base.id_set is not None, "a candidate extends a snapshot's own graph"
    scope = n0 if base.id_set.isdisjoint(ids) else n0 + m
    running, run_start = base.running, base.run_start
    if starts.count(None) != m:  # NOTE: a candidate's ops are new: none runs yet, as a rule
        mine = [i for i, x in enumerate(starts) if x is not None]
        running = running + array("i", [n0 + i for i in mine])
        run_start = run_start + array("d", [starts[i] for i in mine])
    dep_ptr = array("i", list(accumulate(map(len, deps), initial=base.dep_ptr[-1])))[1:]
    firsts = base.firsts
    if any(fto):
        firsts = {**firsts, **dict(compress(enumerate(fto, n0), fto))}
    g = Graph([*base.ops, *new], base.ids + list(ids), None, base.names, base.devices,
              base.where, base.dev + array("i", [base.where[d] for d in on]),
              base.pr + array("i", prio), base.issued + array("d", [now]) * m,
              base.oid + array("q", ids), base.dur + array("d", est),
              base.mem_of + array("q", mem_of), base.dep_ptr + dep_ptr,
              base.dep_ids + array("q", list(chain.from_iterable(deps))), scope, running,
              run_start, firsts)
    if inter is not None and base.cls is not None:
        g.cls = base.cls + array("i", inter.class_indices(names))
    return g


def classes(g: Graph, base: Graph, inter: Interference) -> array:
    """`g.cls`, filled from `base`'s (the graph `g` extends, or `g` itself) where it can."""
    if g.cls is None:
        if base.cls is None:
            base.cls = array("i", inter.class_indices([o.name for o in base.ops]))
        g.cls = base.cls if g is base else base.cls + array(
            "i", inter.class_indices([o.name for o in g.ops[len(base.ops):]]))
    return g.cls


@dataclass(frozen=True, slots=True)
class Sharing:
    """The co-location model as the loop reads it: host index per device (-1: alone), the
    digit base of a host's code of running classes, and the excess slowdowns,
    `excess[a][b]` row by row."""

    host: array
    base: int
    excess: array
    num_hosts: int = field(init=False)
    num_classes: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "num_hosts", max(self.host, default=-1) + 1)
        object.__setattr__(self, "num_classes", round(len(self.excess) ** 0.5))
        assert self.num_classes ** 2 == len(self.excess)
        # NOTE: a host's code of running classes is an int64 in the loop
        assert self.base ** self.num_classes < 2**62, "too many devices on one host"


class OpTimes(Mapping[int, float]):
    """Op id -> time from the loop's column (NaN: none), made a dict when first read: a
    prediction is read for a few ops, or for none."""

    __slots__ = ("_ids", "_times", "_complete", "_map")

    def __init__(self, ids: list[int], times: array, complete: bool) -> None:
        self._ids, self._times, self._complete = ids, times, complete
        self._map: dict[int, float] | None = None

    def _dict(self) -> dict[int, float]:
        if self._map is None:
            t = self._times.tolist()
            self._map = (dict(zip(self._ids, t, strict=True)) if self._complete else
                         {i: x for i, x in zip(self._ids, t, strict=True) if x == x})
        return self._map

    def __getitem__(self, op_id: int) -> float:
        return self._dict()[op_id]

    def __iter__(self) -> Iterator[int]:
        return iter(self._dict())

    def __len__(self) -> int:
        return len(self._dict())

    def __repr__(self) -> str:
        return repr(self._dict())


@dataclass(slots=True)
class Outcome:
    """Per op (by position): start and finish (NaN: none) and the order of completion
    (-1: none); per device: peak reserved bytes; when the last op ended."""

    start: array
    finish: array
    rank: array
    finished: int
    peak: list[int]
    end: float


_NO_CLASSES = array("i")
_NO_EXCESS = array("d")


def run(g: Graph, now: float, mem: Sequence[int], sharing: Sharing | None) -> Outcome:
    """Simulate `g` from `now` with `mem` reserved per device (`sharing` None: every
    device alone, as `simulator._run_solo`; else `classes(g, ...)` was filled)."""
    lib = library()
    assert lib is not None, "the simulator's C loop is not available on this machine"
    n, n_dev = len(g.ids), len(g.devices)
    host, cls, base, excess, num_hosts, num_classes = _NO_CLASSES, _NO_CLASSES, 1, _NO_EXCESS, 0, 0
    if sharing is not None:  # NOTE: else the loop keeps every device alone itself
        assert g.cls is not None
        host, cls, base, excess = sharing.host, g.cls, sharing.base, sharing.excess
        num_hosts, num_classes = sharing.num_hosts, sharing.num_classes
    now_mem, peak = array("q", mem), array("q", mem)
    start, finish = array("d", bytes(8 * n)), array("d", bytes(8 * n))  # filled by the loop
    rank = array("i", bytes(4 * n))
    end = ctypes.c_double(now)
    args = array("q", (  # NOTE: in `sim_run_packed`'s order (csrc/simloop.c)
        n, n_dev, sharing is None, g.dev.buffer_info()[0], g.dep_ptr.buffer_info()[0],
        g.dep_ids.buffer_info()[0], g.scope, g.pr.buffer_info()[0], g.issued.buffer_info()[0],
        g.oid.buffer_info()[0], g.dur.buffer_info()[0], g.mem_of.buffer_info()[0],
        len(g.running), g.running.buffer_info()[0], g.run_start.buffer_info()[0],
        host.buffer_info()[0], num_hosts, cls.buffer_info()[0], base, num_classes,
        excess.buffer_info()[0], now_mem.buffer_info()[0],
        peak.buffer_info()[0], start.buffer_info()[0], finish.buffer_info()[0],
        rank.buffer_info()[0]))
    done = lib.sim_run_packed(args.buffer_info()[0], len(args), now, ctypes.byref(end))
    if done < 0:  # -1: out of memory; -2: too many op classes; -3: arguments miscounted
        fail = MemoryError if done == -1 else RuntimeError
        raise fail(f"the simulator's C loop failed with code {done}")
    return Outcome(start, finish, rank, done, peak.tolist(), end.value)
