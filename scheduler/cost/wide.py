"""The wide factor: how long a prefill's operator chain takes on the threads of two CPU
devices of one host (`executors.wide`) against the threads of one, timed at profiling.

A wide op's estimate is its op's estimate on one device times this factor
(`scheduler.round.plan.Builder`); the policy offers wide plans only for prompts
long enough that their operators split well over more threads (`WIDE_MIN_TOKENS`
in `scheduler.policies.slice`), so one factor, timed at such a prompt, prices them.
"""

from __future__ import annotations

import statistics

import torch

from models.cpu import torch_threads
from models.loader import Model
from scheduler.cost.oprunner import Clock, ShapeRunner


def measure_wide(model: Model, tokens: int, threads: int, repeats: int,
                 clock: Clock, block_size: int = 16) -> float:
    """Median chain time of a `tokens`-token prefill on `2 * threads` intra-op threads over
    its median on `threads`, the two interleaved (after one warm-up run of each) so a change
    in background load hits both alike. Runs in the calling thread."""
    case = ((tokens,), (0,))
    runner = ShapeRunner(model, torch.device("cpu"), [case], block_size, clock)
    batch = runner.batch(case)
    narrow: list[float] = []
    wide: list[float] = []
    for r in range(repeats + 1):
        for n, out in ((threads, narrow), (2 * threads, wide)):
            with torch_threads(n):
                seconds = sum(runner.run_once(batch))
            if r:
                out.append(seconds)
    return statistics.median(wide) / statistics.median(narrow)
