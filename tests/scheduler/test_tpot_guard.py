"""A low-priority flood cannot slow a paced high-priority stream past its TPOT SLO.

Fake executors on a virtual clock (1 ms per op + 0.1 ms per token; a one-token step of
the 6-op chain takes 6.6 ms alone): eight 400-token low requests saturate both devices,
then an interactive request with a 20 ms TPOT SLO streams 30 tokens.
"""

from __future__ import annotations

from executors.types import Priority
from tests.scheduler.cluster import ClusterRun, Outcome

TPOT_S = 0.02


async def _stream(tpot_s: float | None) -> tuple[Outcome, list[Outcome]]:
    async with ClusterRun("slice") as run:
        # an earlier request of the paced tenant: its SLO is known before the flood
        run.submit("hi0", Priority.HIGH, 40, max_tokens=2, slo_s=0.5, tpot_s=tpot_s)
        low = [run.submit(f"lo{i}", Priority.LOW, 400, max_tokens=64) for i in range(8)]
        await run.run_until(0.05)
        hi = run.submit("hi", Priority.HIGH, 40, max_tokens=30, slo_s=0.5, tpot_s=tpot_s)
        await run.run_out()
    return hi, low


async def test_the_stream_keeps_its_pace_under_a_low_flood() -> None:
    hi, low = await _stream(TPOT_S)
    assert len(hi.tokens) == 30 and max(hi.gaps()) <= TPOT_S
    assert all(len(o.tokens) == 64 for o in low)  # the low work still completes


async def test_without_a_tpot_slo_the_flood_slows_the_stream() -> None:
    hi, _ = await _stream(None)
    assert len(hi.tokens) == 30 and max(hi.gaps()) > 4 * TPOT_S
