"""Variant chains under the whole scheduler: fake executors on a virtual clock, KV checked.

The weightless 4-layer model with `layer_groups=(1, 4)`: its chain runs the 4 layers as one
op, the variant as 4 ops of one layer (models/variants.py). Costs see layers
(`layered_time`: 1 ms per layer group plus 25 us per token and layer). Ops compute on the
scheduler's real KV pools (tests/scheduler/kvcheck.py): every layer op checks that each
earlier position of its sequence reads back what was fed there, whichever granularity
wrote it, and the head's token is a function of the whole sequence.
"""

from __future__ import annotations

import re

import torch

from executors.types import Priority
from models.skeleton import skeleton
from tests.scheduler.cluster import CONFIG, ClusterRun, Outcome
from tests.scheduler.conftest import layered_time
from tests.scheduler.kvcheck import expected_tokens

TPOT_S = 0.02
FINE = re.compile(r"layers\[(\d):(\d)\]")


def _prompt(i: int, n: int) -> list[int]:
    return [3 + (7 * i + j) % 50 for j in range(n)]


async def _flood(tpot_s: float | None, layer_groups: tuple[int, ...] = (1, 4)
                 ) -> tuple[ClusterRun, Outcome, list[Outcome]]:
    """Eight 400-token low requests saturating both devices; an interactive stream of 30
    tokens (with a `tpot_s` pace, or none) arriving once they run."""
    model = skeleton(CONFIG, torch.float32, layer_groups=layer_groups)
    async with ClusterRun("slice", model=model, kv_check=True, op_time=layered_time) as run:
        run.submit("hi0", Priority.HIGH, 0, 2, slo_s=0.5, tpot_s=tpot_s, prompt=_prompt(99, 40))
        low = [run.submit(f"lo{i}", Priority.LOW, 0, 16, prompt=_prompt(i, 400))
               for i in range(8)]
        await run.run_until(0.05)
        hi = run.submit("hi", Priority.HIGH, 0, 30, slo_s=0.5, tpot_s=tpot_s,
                        prompt=_prompt(42, 40))
        await run.run_out()
    assert run.kv_model is not None and not run.kv_model.mismatches
    assert hi.tokens == expected_tokens(_prompt(42, 40), 30)
    assert all(o.tokens == expected_tokens(_prompt(i, 400), 16) for i, o in enumerate(low))
    return run, hi, low


def _layer_ops(run: ClusterRun, priority: Priority) -> list[int]:
    """Layers per op of every layer-group op of `priority` that ran."""
    return [int(m[2]) - int(m[1]) for op in run.ops
            if op.priority == priority and (m := FINE.fullmatch(op.name))]


async def test_under_a_pace_low_work_runs_fine_ops_and_every_token_is_right() -> None:
    run, hi, _ = await _flood(TPOT_S)
    low = _layer_ops(run, Priority.LOW)
    assert 1 in low  # the variant ran low work between the stream's steps
    assert set(_layer_ops(run, Priority.HIGH)) == {4}  # the stream ran the chain
    assert max(hi.gaps()) <= TPOT_S


async def test_without_a_pace_low_work_runs_the_coarse_chain() -> None:
    run, _, _ = await _flood(None)
    assert set(_layer_ops(run, Priority.LOW)) == {4}
