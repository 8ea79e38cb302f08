"""Turning tracing on: the flag, the protocol the environment names, the exporter chosen, a
clear error without the extra, and no OpenTelemetry SDK imported without the flag."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)

from gateway.__main__ import build_parser, config_from_args, main
from gateway.config import ConfigError, ServerSettings
from gateway.tracing import otel
from gateway.tracing.setup import (
    TracingUnavailable,
    check_tracing,
    exporter_endpoint,
    incoming_context,
    start_tracing,
    traces_protocol,
)


def test_the_protocol_comes_from_the_environment_as_opentelemetry_reads_it() -> None:
    assert traces_protocol({}) == "http/protobuf"
    assert traces_protocol({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}) == "grpc"
    assert traces_protocol({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}) \
        == "http/protobuf"
    with pytest.raises(TracingUnavailable, match="'http/json' is not supported"):
        traces_protocol({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"})


def test_an_http_endpoint_without_a_path_posts_to_v1_traces() -> None:
    assert exporter_endpoint("http://otel:4318", "http/protobuf") == "http://otel:4318/v1/traces"
    assert exporter_endpoint("https://otel:4318/", "http/protobuf") \
        == "https://otel:4318/v1/traces"
    assert exporter_endpoint("http://otel/custom/path", "http/protobuf") \
        == "http://otel/custom/path"
    assert exporter_endpoint("otel:4317", "grpc") == "otel:4317"
    with pytest.raises(TracingUnavailable, match="http:// or https:// URL"):
        exporter_endpoint("otel:4318", "http/protobuf")


@pytest.mark.parametrize(("protocol", "cls"), [("grpc", GrpcSpanExporter),
                                               ("http/protobuf", HttpSpanExporter)])
def test_the_protocol_picks_the_exporter(protocol: str, cls: type) -> None:
    tracing: Any = start_tracing("http://127.0.0.1:9",
                                 {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": protocol})
    try:
        assert isinstance(tracing, otel.OtelTracing)
        assert isinstance(tracing.exporter.inner, cls)
    finally:
        tracing.shutdown()


def test_without_the_extra_the_error_says_what_to_install(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    real = importlib.util.find_spec

    def missing_grpc(name: str, *args: Any) -> Any:
        return None if name.startswith("opentelemetry.exporter.otlp.proto.grpc") \
            else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", missing_grpc)
    env = {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}
    with pytest.raises(TracingUnavailable, match=r"pip install 'slicegate\[otel\]'"):
        check_tracing("http://127.0.0.1:4317", env)
    assert check_tracing("http://127.0.0.1:4318", {}) == "http://127.0.0.1:4318/v1/traces"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
    status = main(["serve", "--otlp-traces-endpoint", "http://127.0.0.1:4317",
                   "--data-dir", str(tmp_path), "--devices", "cpu:0"])
    assert status == 2  # before the model loads
    assert "pip install 'slicegate[otel]'" in capsys.readouterr().err


def test_the_flag_and_the_config_key() -> None:
    args = build_parser().parse_args(["serve", "--otlp-traces-endpoint", "http://c:4318",
                                      "--devices", "cpu:0"])
    assert config_from_args(args).server.otlp_traces_endpoint == "http://c:4318"
    assert ServerSettings().otlp_traces_endpoint is None
    with pytest.raises(ConfigError, match="server.otlp_traces_endpoint"):
        ServerSettings(otlp_traces_endpoint="")


def test_only_the_w3c_headers_are_carried() -> None:
    headers = {"traceparent": "00-ab-cd-01", "tracestate": "k=v", "authorization": "x"}
    assert incoming_context(headers) == {"traceparent": "00-ab-cd-01", "tracestate": "k=v"}
    assert incoming_context({}) == {}


def test_without_the_flag_no_opentelemetry_sdk_is_imported() -> None:
    code = ("import sys; import gateway.__main__, gateway.app, gateway.server; "
            "mods = [m for m in sys.modules if m.startswith(('opentelemetry.sdk', "
            "'opentelemetry.exporter', 'gateway.tracing.otel'))]; print(mods)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == "[]"
