"""Request spans from the app over the fake scheduler, exported to a real OTLP/HTTP receiver:
the incoming trace continued, vLLM's attributes equal to the response, plan child spans."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from tests.gateway.batches.helpers import line, results, submit, wait_for
from tests.gateway.harness import EngineFactory, make_config, running, sse_events
from tests.gateway.tracing.receivers import Collected, Received, http_receiver

SERVER, INTERNAL = 2, 1  # OTLP's Span.SpanKind values
STATUS_ERROR = 2


@pytest.fixture
def receiver() -> Iterator[tuple[str, Collected]]:
    with http_receiver() as r:
        yield r


def traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def by_name(spans: list[Received], prefix: str) -> list[Received]:
    return [s for s in spans if s.name.startswith(prefix)]


async def test_a_completion_span_continues_the_callers_trace(
        make_engine: EngineFactory, receiver: tuple[str, Collected]) -> None:
    url, collected = receiver
    header, trace_id, parent_id = traceparent()
    async with running(make_config(otlp_traces_endpoint=url), make_engine()) as h:
        r = await h.client.post("/v1/completions", headers={"traceparent": header}, json={
            "model": "tiny", "prompt": "the capital of France is", "max_tokens": 5,
            "temperature": 0.5, "top_p": 0.9})
        assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    spans = collected.wait(3)  # flushed when the app stopped
    [span] = by_name(spans, "text_completion")
    assert span.name == "text_completion tiny" and span.kind == SERVER
    assert (span.trace_id, span.parent_span_id) == (trace_id, parent_id)
    a = span.attributes
    assert a["gen_ai.usage.prompt_tokens"] == usage["prompt_tokens"]
    assert a["gen_ai.usage.completion_tokens"] == usage["completion_tokens"] == 5
    assert a["gen_ai.usage.cached_tokens"] == 0
    assert a["gen_ai.request.id"] == r.json()["id"]
    assert (a["gen_ai.request.max_tokens"], a["gen_ai.request.temperature"],
            a["gen_ai.request.top_p"], a["gen_ai.request.n"]) == (5, 0.5, 0.9, 1)
    assert a["gen_ai.response.model"] == "tiny"
    assert a["gen_ai.response.finish_reasons"] == ["length"]
    assert (a["slicegate.tenant"], a["slicegate.priority"], a["slicegate.origin"]) == \
        ("default", r.headers["x-slicegate-priority"], "http")
    assert a["slicegate.num_preemptions"] == 0
    assert 0 <= a["gen_ai.latency.time_in_queue"] <= a["gen_ai.latency.time_to_first_token"] \
        <= a["gen_ai.latency.e2e"]
    assert span.resource["service.name"] == "slicegate"
    assert [e[0] for e in span.events] == ["scheduled", "first_token"]
    children = [s for s in spans if s.parent_span_id == span.span_id]
    assert [c.name for c in children] == ["prefill", "decode"]
    prefill, decode = children
    assert all(c.kind == INTERNAL and c.trace_id == trace_id for c in children)
    assert prefill.attributes["slicegate.plan.devices"] == ["cpu:0"]
    assert prefill.attributes["slicegate.plan.num_tokens"] == usage["prompt_tokens"]
    assert decode.attributes["slicegate.plan.count"] == 4  # tokens after the first
    assert span.start_ns <= prefill.start_ns <= prefill.end_ns <= decode.end_ns <= span.end_ns


async def test_a_streamed_chat_with_two_choices_is_one_root_span(
        make_engine: EngineFactory, receiver: tuple[str, Collected]) -> None:
    url, collected = receiver
    async with running(make_config(otlp_traces_endpoint=url), make_engine()) as h:
        r = await h.client.post("/v1/chat/completions", json={
            "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "n": 2,
            "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}})
        assert r.status_code == 200, r.text
    usage = sse_events(r.text)[-2]["usage"]
    spans = collected.wait(5)
    [span] = by_name(spans, "chat")
    assert span.parent_span_id == ""  # no traceparent: a new trace
    a = span.attributes
    assert (a["gen_ai.operation.name"], a["gen_ai.request.n"],
            a["gen_ai.usage.num_sequences"]) == ("chat", 2, 2)
    assert a["gen_ai.usage.completion_tokens"] == usage["completion_tokens"] == 6
    assert a["gen_ai.usage.prompt_tokens"] == usage["prompt_tokens"]
    choices = sorted(s.attributes["slicegate.choice"] for s in spans
                     if s.parent_span_id == span.span_id)
    assert choices == [0, 0, 1, 1]  # a prefill and a decode run each


async def test_a_failed_generation_is_an_error_span_and_spans_are_counted(
        make_engine: EngineFactory, receiver: tuple[str, Collected]) -> None:
    url, collected = receiver
    async with running(make_config(otlp_traces_endpoint=url), make_engine(error_after=2)) as h:
        r = await h.client.post("/v1/completions",
                                json={"model": "tiny", "prompt": "hello", "max_tokens": 8})
        assert r.status_code == 500
    spans = collected.wait(1)
    [span] = by_name(spans, "text_completion")
    assert span.status_code == STATUS_ERROR
    assert span.attributes["gen_ai.response.finish_reasons"] == ["error"]


async def test_metrics_count_the_spans_exported(
        make_engine: EngineFactory, receiver: tuple[str, Collected]) -> None:
    url, _ = receiver
    async with running(make_config(otlp_traces_endpoint=url), make_engine()) as h:
        await h.client.post("/v1/completions",
                            json={"model": "tiny", "prompt": "hello", "max_tokens": 2})
        tracing: Any = h.app.state.gateway.tracing
        tracing.provider.force_flush()
        text = (await h.client.get("/metrics")).text
    assert 'slicegate_trace_spans_total{result="exported"} 3.0' in text
    assert 'slicegate_trace_spans_total{result="failed"} 0.0' in text


async def test_batch_lines_are_root_spans_marked_batch(
        make_engine: EngineFactory, receiver: tuple[str, Collected]) -> None:
    url, collected = receiver
    async with running(make_config(otlp_traces_endpoint=url), make_engine()) as h:
        batch = await submit(h.client, "none", [line(0), line(1, max_tokens=2)])
        done = await wait_for(h.client, "none", batch["id"])
        out = await results(h.client, "none", done["output_file_id"])
    spans = by_name(collected.wait(6), "chat")
    assert len(spans) == 2 and {s.attributes["slicegate.origin"] for s in spans} == {"batch"}
    assert all(s.parent_span_id == "" for s in spans)
    assert {s.attributes["gen_ai.request.id"]: s.attributes["gen_ai.usage.completion_tokens"]
            for s in spans} == {r["response"]["body"]["id"]:
                                r["response"]["body"]["usage"]["completion_tokens"] for r in out}
