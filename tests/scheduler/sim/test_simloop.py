"""The simulator's C loop (`scheduler.sim.native`): built where a C compiler works, equal to
the Python loops on the graphs only it builds its own way, and off (the Python loops
run) where no compiler works."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
from array import array
from pathlib import Path

import pytest

from executors.interference import Interference
from executors.types import Priority
from scheduler.sim import native as simloop
from scheduler.sim.gmg import DeviceView, SimOp, Snapshot
from scheduler.sim.simulator import simulate
from scheduler.sim.types import Candidate
from tests.scheduler.simref import reference

needs_loop = pytest.mark.skipif(simloop.library() is None,
                                reason="no C compiler: the C loop cannot be built here")
INTER = Interference({"cpu:0": "h", "cpu:1": "h"}, {("layers", "layers"): 1.5,
                                                    ("head", "layers"): 1.2})


def _snapshot() -> Snapshot:
    """A chain on cpu:0 (its first op running), a chain on cpu:1 waiting on it and on an
    op already done (id 99, not in the graph)."""
    ops = (SimOp(0, "layers[0:5]", "cpu:0", Priority.LOW, (), 0.5, 0.0, 0.1, 1 << 20),
           SimOp(1, "head", "cpu:0", Priority.LOW, (0,), 0.25, 0.0, None, 1 << 20, ("r0",)),
           SimOp(2, "layers[0:5]", "cpu:1", Priority.HIGH, (0, 99), 0.5, 0.0, None, 0),
           SimOp(3, "head", "cpu:1", Priority.HIGH, (2,), 0.125, 0.0, None, 0, ("r1",)))
    views = (DeviceView("cpu:0", 64 << 20, 8 << 20), DeviceView("cpu:1", 64 << 20, 0))
    return Snapshot(0.25, ops, views, (), INTER)


def _both(snap: Snapshot, cand: Candidate | None = None) -> None:
    fast = simulate(snap, cand)
    assert fast == simulate(snap, cand, native=False) == reference(snap, cand)


def test_the_loop_is_built_where_a_c_compiler_works() -> None:
    if not (os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler on this machine")
    assert simloop.library() is not None, simloop.note()


@needs_loop
def test_a_candidate_reusing_an_op_id_links_every_op_as_a_fresh_graph() -> None:
    # op 7 reuses id 1 (the snapshot's head): the graph is linked afresh, and the snapshot's
    # ops waiting on id 1 now wait on the candidate's op, in the Python loops as here
    snap = _snapshot()
    late = SimOp(1, "layers[5:10]", "cpu:1", Priority.NORMAL, (3,), 0.25, 0.25, None, 0)
    _both(snap, Candidate((late,), {"cpu:1": 4 << 20}))
    _both(snap)  # NOTE: the snapshot's own graph stays as it was


@needs_loop
def test_a_candidate_on_a_device_the_snapshot_lacks_builds_a_fresh_graph() -> None:
    snap = _snapshot()
    far = SimOp(10, "embed", "cpu:7", Priority.HIGH, (1,), 0.5, 0.25, None, 2 << 20, ("r2",))
    nxt = SimOp(11, "layers[0:5]", "cpu:0", Priority.HIGH, (10,), 0.5, 0.25, None, 0)
    _both(snap, Candidate((far, nxt)))


@needs_loop
def test_an_op_with_several_successors_and_repeated_deps() -> None:
    snap = _snapshot()
    fan = tuple(SimOp(20 + k, "layers[0:5]", f"cpu:{k % 2}", Priority.NORMAL, (1, 1, 3), 0.1,
                      0.25, None, 0) for k in range(5))
    _both(snap, Candidate(fan))


@needs_loop
def test_a_large_snapshot_on_many_hosts() -> None:
    devices = [f"cpu:{i}" for i in range(12)]
    inter = Interference({d: f"h{i % 3}" for i, d in enumerate(devices)},
                         {(a, b): 1.1 + 0.1 * (i + j) for i, a in enumerate(("embed", "layers"))
                          for j, b in enumerate(("layers", "head"))})
    ops = []
    for i in range(3000):
        prev = (i - 1,) if i % 8 else ()
        ops.append(SimOp(i, ("embed", "layers[0:5]", "head")[i % 3], devices[(i // 8) % 12],
                         list(Priority)[i % 3], prev, 0.001 * (1 + i % 7), 0.0, None, 1024))
    snap = Snapshot(0.0, tuple(ops), tuple(DeviceView(d, 1 << 30, 0) for d in devices), (),
                    inter)
    assert simulate(snap) == simulate(snap, native=False)


def test_without_a_compiler_the_python_loops_run(tmp_path: Path) -> None:
    code = ("import json; from scheduler.sim import native as simloop; "
            "from tests.scheduler.sim.test_simloop import _snapshot; "
            "from scheduler.sim.simulator import simulate; "
            "p = simulate(_snapshot()); "
            "print(json.dumps([simloop.note(), simloop.library() is None, p.end]))")
    env = {**os.environ, "SLICEGATE_CACHE": str(tmp_path), "CC": str(tmp_path / "no-such-cc")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300, check=True, cwd=Path(__file__).parents[3])
    note, off, end = json.loads(done.stdout.strip().splitlines()[-1])
    assert note.startswith("off: ") and off
    assert "the simulator's C loop (the Python loops run instead) is off" in done.stderr
    assert end == simulate(_snapshot(), native=False).end
    assert not list(tmp_path.glob("native/simloop-*.so"))


@needs_loop
def test_ops_that_never_become_ready_get_no_times() -> None:
    # ops 5 and 6 wait on each other: neither loop gives them a time; op 7 runs
    ops = (SimOp(5, "embed", "cpu:0", Priority.LOW, (6,), 0.5, 0.0, None, 0, ("r5",)),
           SimOp(6, "head", "cpu:0", Priority.LOW, (5,), 0.5, 0.0, None, 0),
           SimOp(7, "head", "cpu:1", Priority.LOW, (), 0.5, 0.0, None, 0))
    snap = Snapshot(0.0, ops, (), (), INTER)
    pred = simulate(snap)
    assert pred == simulate(snap, native=False) == reference(snap)
    assert dict(pred.finish) == {7: 0.5} and pred.start.get(5) is None
    assert pred.first_token == {} and pred.end == 0.5


@needs_loop
def test_a_miscounted_argument_array_is_refused() -> None:
    lib = simloop.library()
    assert lib is not None
    args, end = array("q", [0] * 5), ctypes.c_double(0.0)
    assert lib.sim_run_packed(args.buffer_info()[0], len(args), 0.0, ctypes.byref(end)) == -3
