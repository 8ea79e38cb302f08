"""End to end: the real server on the default model exports request spans to a real OTLP/HTTP
receiver (protobuf decoded), continuing the trace the official openai client sent; and over
gRPC to a real gRPC receiver."""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Iterator

import openai
import pytest

from gateway.config import GatewayConfig, load_config
from gateway.engine import Engine, build_engine
from tests.gateway.harness import EngineFactory, live_server, make_config
from tests.gateway.tracing.receivers import grpc_receiver, http_receiver


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    config = load_config(None, {"model.spec": "default", "scheduler.devices": "cpu:0,cpu:1"})
    yield build_engine(config)


@pytest.fixture(autouse=True)
def quick_export(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spans leave every 50 ms instead of 5 s (read when the server starts)."""
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")


def _traced(config: GatewayConfig, url: str) -> GatewayConfig:
    return dataclasses.replace(config, server=dataclasses.replace(
        config.server, otlp_traces_endpoint=url))


def test_the_default_model_exports_a_span_per_request_to_an_otlp_http_receiver(
        engine: Engine) -> None:
    config = load_config(None, {"model.spec": "default", "scheduler.devices": "cpu:0,cpu:1"})
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    header = {"traceparent": f"00-{trace_id}-{parent_id}-01"}
    with http_receiver() as (url, collected), live_server(_traced(config, url), engine) as live:
        client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="none", max_retries=0)
        chat = client.chat.completions.create(
            model=engine.served_model_name, max_tokens=6, temperature=0, extra_headers=header,
            messages=[{"role": "user", "content": "Name a colour."}])
        stream = client.completions.create(
            model=engine.served_model_name, prompt="One, two, three,", max_tokens=4,
            stream=True, stream_options={"include_usage": True}, temperature=0)
        streamed = [chunk for chunk in stream]
        spans = collected.wait(2 + 4)  # two requests, each a prefill and >= 1 decode run
    requests = {s.attributes["gen_ai.operation.name"]: s for s in spans
                if "gen_ai.operation.name" in s.attributes}
    span = requests["chat"]
    assert (span.trace_id, span.parent_span_id) == (trace_id, parent_id)
    assert chat.usage is not None and chat.id == span.attributes["gen_ai.request.id"]
    assert span.attributes["gen_ai.usage.prompt_tokens"] == chat.usage.prompt_tokens
    assert span.attributes["gen_ai.usage.completion_tokens"] == chat.usage.completion_tokens
    assert span.attributes["gen_ai.response.finish_reasons"] == \
        [chat.choices[0].finish_reason]
    children = [s for s in spans if s.parent_span_id == span.span_id]
    assert children[0].name == "prefill" and {c.name for c in children[1:]} <= {"decode"}
    assert children[0].attributes["slicegate.plan.num_tokens"] == chat.usage.prompt_tokens
    devices = {d for c in children for d in c.attributes["slicegate.plan.devices"]}
    assert devices and devices <= {"cpu:0", "cpu:1"}
    decoded = sum(c.attributes["slicegate.plan.count"] for c in children[1:])
    assert decoded == chat.usage.completion_tokens - 1  # the prefill samples the first
    other = requests["text_completion"]
    usage = streamed[-1].usage
    assert usage is not None and other.parent_span_id == "" and other.trace_id != trace_id
    assert other.attributes["gen_ai.usage.completion_tokens"] == usage.completion_tokens
    assert other.attributes["gen_ai.latency.time_to_first_token"] > 0


def test_grpc_is_chosen_by_the_environment_and_reaches_a_grpc_receiver(
        make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
    with grpc_receiver() as (url, collected), \
            live_server(make_config(otlp_traces_endpoint=url), make_engine()) as live:
        client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="none", max_retries=0)
        done = client.completions.create(model="tiny", prompt="hello", max_tokens=3)
        spans = collected.wait(3)
    [span] = [s for s in spans if s.name == "text_completion tiny"]
    assert done.usage is not None
    assert span.attributes["gen_ai.usage.completion_tokens"] == done.usage.completion_tokens
