"""A tenant's `tpot_slo_ms` through the real server: the openai client streams an
interactive answer while a batch tenant's requests run, and /metrics counts the pace kept.

The real `python -m gateway serve` on the tiny random model, so the TPOT guard runs on real
ops, with the estimator's predictions: the SLO is generous (the point is that the guarded
scheduler serves both tenants and that the metrics count it, not a timing).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.gateway.harness import ADMIN, stream_beside_batch, tiny_server_args
from tests.serve import GatewayProcess

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[GatewayProcess]:
    s = GatewayProcess(tiny_server_args(tmp_path, ide={"ttft_slo_ms": 5000,
                                                       "tpot_slo_ms": 5000}),
                       tmp_path / "server.log")
    try:
        yield s
    finally:
        s.close()


async def test_a_paced_stream_beside_batch_work(server: GatewayProcess) -> None:
    done = await stream_beside_batch(server.url, model="tiny-random", prompt="lorem ipsum " * 60,
                                     max_tokens=24, temperature=0,
                                     extra_body={"ignore_eos": True})
    assert all(d.usage is not None and d.usage.completion_tokens == 24 for d in done)
    metrics = ""
    for _ in range(50):  # NOTE: a request is counted when its job ends, just after its stream
        metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
        if 'slicegate_tpot_slo_requests_total{tenant="ide"}' in metrics:
            break
        await asyncio.sleep(0.1)
    assert 'slicegate_tenant_tpot_slo_seconds{priority="high",tenant="ide"} 5.0' in metrics
    assert 'slicegate_tpot_slo_requests_total{tenant="ide"} 1.0' in metrics
    assert 'slicegate_tpot_slo_attained_total{tenant="ide"} 1.0' in metrics
    gmg = httpx.get(f"{server.url}/admin/gmg", headers=ADMIN, timeout=5).json()
    assert sum(d["kv_blocks_used"] for d in gmg["devices"]) == 0
