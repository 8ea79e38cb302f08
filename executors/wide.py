"""Wide ops: a long prefill's operators on the cores of two CPU devices at once.

A wide plan runs its whole chain on one device (its KV lives there) and borrows
a partner device of the same host for as long as the chain runs. On the
partner it issues two HOLD ops: a claim, which ends as soon as it starts (the
chain's first op depends on it, so the chain starts only once the partner has
finished what it was running), and a hold, which keeps the partner's thread
asleep until the chain's last op ends. Until the hold has ended, each op of
the chain runs on both devices' intra-op threads.

NOTE: measured on a 2-core machine (one thread per device), a 465-token prefill
through the default model's chain: 0.64 s on one thread, 0.39-0.40 s on two
while the partner's thread sleeps, 0.63 s on two while the partner runs ops (the
cores are oversubscribed): hence the claim before the chain and the hold beside it.
"""

from __future__ import annotations

from collections.abc import Callable

from executors.types import OpInstance

HOLD_SLACK_S = 0.25  # a hold outlasts its estimate by at most twice it plus this


def threads_for(op: OpInstance, own: int) -> int:
    """Intra-op threads to run `op` on: both devices' until its partner's hold has ended.

    NOTE: not only while the hold runs: the chain's first op starts once the claim has
    ended, and the partner's thread may not have started the hold yet (it runs the
    claim's report first); a higher-class op queued there before the plan may also run
    between the two, as in the simulation, sharing the cores for that long."""
    if op.wide is not None and not op.wide.state.is_finished:
        return 2 * own
    return own


def hold(op: OpInstance, now: Callable[[], float], wait: Callable[[float], object]) -> None:
    """Keep the calling (partner's) thread until the chain's last op (`op.input`) is
    finished, sleeping in `wait(seconds)` (woken when any op ends).

    NOTE: a chain withdrawn before it ran (its request aborted) never finishes: the hold
    then ends at twice its estimate (plus `HOLD_SLACK_S`) after it started, and so does
    one whose chain runs far longer than predicted (the partner's queue must not starve)."""
    last = op.input
    if last is None:
        return
    until = now() + 2 * op.est_s + HOLD_SLACK_S
    while not last.state.is_finished:
        left = until - now()
        if left <= 0:
            return
        wait(min(left, 0.05))
