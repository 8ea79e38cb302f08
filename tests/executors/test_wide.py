"""Wide ops (executors/wide.py): a claim and a hold on the partner device, the chain on both
devices' threads while the hold has not ended (real executor threads)."""

from __future__ import annotations

import itertools
import time

import torch

from executors.types import OpInstance, OpRole, OpState, Priority
from executors.wide import HOLD_SLACK_S, hold, threads_for
from tests.executors.chains import SHAPE, Sink, executors, plain_op

_ids = itertools.count(50_000)


def _hold_op(device: str, name: str, deps: tuple[OpInstance, ...] = (),
             last: OpInstance | None = None, est_s: float = 0.0) -> OpInstance:
    return OpInstance(next(_ids), name, OpRole.HOLD, -1, device, Priority.HIGH, SHAPE, ("r",),
                      deps=deps, input=last, est_s=est_s)


def _wide_plan(n: int = 3, est_s: float = 0.01) -> tuple[OpInstance, OpInstance,
                                                          list[OpInstance]]:
    """A claim and a hold on cpu:1 and a chain of `n` ops on cpu:0 lent cpu:1's cores."""
    claim = _hold_op("cpu:1", "claim")
    chain: list[OpInstance] = []
    for i in range(n):
        deps = (chain[-1],) if chain else (claim,)
        chain.append(plain_op("cpu:0", Priority.HIGH, deps, f"layers[{i}:{i + 1}]", est_s))
    held = _hold_op("cpu:1", "hold", (claim,), chain[-1], n * est_s)
    for op in chain:
        op.wide = held
    return claim, held, chain


def test_a_wide_chain_runs_on_both_devices_threads_while_its_partner_is_held() -> None:
    threads: dict[str, int] = {}

    def run_op(op: OpInstance) -> None:
        threads[op.name] = torch.get_num_threads()
        time.sleep(0.01)

    claim, held, chain = _wide_plan()
    sink = Sink()
    with executors(["cpu:0", "cpu:1"], run_op, sink) as exs:
        exs["cpu:1"].enqueue_many([claim, held])
        exs["cpu:0"].enqueue_many(chain)
        sink.wait_finished([claim, held, *chain])
        after = plain_op("cpu:0", Priority.HIGH, name="after")  # the hold has ended
        exs["cpu:0"].enqueue(after)
        sink.wait_finished([after])
    assert all(op.state is OpState.DONE for op in (claim, held, *chain))
    assert [threads[op.name] for op in chain] == [2, 2, 2] and threads["after"] == 1
    assert claim.end is not None and chain[0].start is not None and claim.end <= chain[0].start
    assert held.end is not None and chain[-1].end is not None and held.end >= chain[-1].end
    assert held.end - chain[-1].end < 0.05  # woken by the chain's end, not by its deadline


def test_the_partner_runs_its_own_ops_again_once_the_chain_ends() -> None:
    order: list[str] = []
    claim, held, chain = _wide_plan(est_s=0.02)
    mine = plain_op("cpu:1", Priority.LOW, name="low on the partner")

    def run_op(op: OpInstance) -> None:
        order.append(op.name)
        time.sleep(0.01)

    sink = Sink()
    with executors(["cpu:0", "cpu:1"], run_op, sink) as exs:
        exs["cpu:1"].enqueue_many([claim, held])
        exs["cpu:0"].enqueue_many(chain)
        exs["cpu:1"].enqueue(mine)  # queued behind the high-priority hold
        sink.wait_finished([held, mine, *chain])
    assert mine.start is not None and chain[-1].end is not None
    assert mine.start >= chain[-1].end and order[-1] == "low on the partner"


def test_a_hold_whose_chain_never_runs_ends_at_twice_its_estimate() -> None:
    last = plain_op("cpu:0")  # never issued: its request was aborted
    held = _hold_op("cpu:1", "hold", last=last, est_s=0.05)
    t = [0.0]
    waits: list[float] = []

    def wait(s: float) -> None:
        waits.append(s)
        t[0] += s

    hold(held, lambda: t[0], wait)
    assert t[0] >= 2 * 0.05 + HOLD_SLACK_S and t[0] < 2 * 0.05 + HOLD_SLACK_S + 0.06
    assert max(waits) <= 0.05


def test_threads_double_only_until_the_hold_has_ended() -> None:
    _, held, chain = _wide_plan()
    held.state = OpState.ISSUED
    assert threads_for(chain[0], 2) == 4  # the claim ended; the hold has not started yet
    held.state = OpState.RUNNING
    assert threads_for(chain[1], 1) == 2
    held.state = OpState.DONE
    assert threads_for(chain[2], 1) == 1
    assert threads_for(plain_op("cpu:0"), 1) == 1
