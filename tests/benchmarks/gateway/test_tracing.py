"""benchmarks.gateway.tracing: pairs alternate which arm goes first; the sink counts spans."""

from __future__ import annotations

import httpx
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from benchmarks.gateway.tracing import otlp_sink, paired_round


async def test_pairs_alternate_which_arm_goes_first() -> None:
    calls: list[str] = []

    async def call(arm: str) -> float:
        calls.append(arm)
        return float(len(calls))

    out = await paired_round(call, pairs=3)
    assert calls == ["off", "on", "on", "off", "off", "on"]
    assert out == {"off": [1.0, 4.0, 5.0], "on": [2.0, 3.0, 6.0]}


def test_the_sink_counts_request_spans_only() -> None:
    request = trace_service_pb2.ExportTraceServiceRequest()
    spans = request.resource_spans.add().scope_spans.add().spans
    spans.add(name="chat tiny").attributes.add(key="gen_ai.operation.name").value.string_value \
        = "chat"
    spans.add(name="prefill")
    with otlp_sink() as (url, sink):
        r = httpx.post(f"{url}/v1/traces", content=request.SerializeToString())
        assert r.status_code == 200
    assert sink.request_spans() == 1
