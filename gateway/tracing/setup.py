"""Turning tracing on: the OTLP protocol from the environment, a clear error without the
`otel` extra, the incoming W3C trace context, and the span counts for /metrics.

Nothing of OpenTelemetry is imported here: `start_tracing` imports `gateway.tracing.otel`
(and with it the SDK) only when `--otlp-traces-endpoint` is set.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator, Mapping
from typing import Protocol
from urllib.parse import urlsplit

from prometheus_client.core import CounterMetricFamily, Metric

from gateway.job import Job

PROTOCOLS = ("http/protobuf", "grpc")  # OTEL_EXPORTER_OTLP_TRACES_PROTOCOL's, as the SDK has
TRACE_HEADERS = ("traceparent", "tracestate")  # W3C Trace Context
EXTRA_HINT = "pip install 'slicegate[otel]'"
_MODULES = {"http/protobuf": "opentelemetry.exporter.otlp.proto.http",
            "grpc": "opentelemetry.exporter.otlp.proto.grpc"}


class TracingUnavailable(Exception):
    """Tracing was asked for but cannot run: the SDK is missing or a setting is wrong."""


class Tracing(Protocol):
    """What the app holds while tracing is on (`gateway.tracing.otel.OtelTracing`)."""

    def record(self, job: Job, end: float) -> None:
        """Queue the span of a finished job (ended at monotonic `end`) for export."""
        ...

    @property
    def counts(self) -> tuple[int, int]:
        """(spans exported, spans lost) so far."""
        ...

    def shutdown(self) -> None:
        """Export what is queued, then stop (blocks up to a few seconds)."""
        ...


def traces_protocol(environ: Mapping[str, str]) -> str:
    """OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else OTEL_EXPORTER_OTLP_PROTOCOL, else
    http/protobuf (OpenTelemetry's default)."""
    protocol = (environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf").strip()
    if protocol not in PROTOCOLS:
        raise TracingUnavailable(f"OTLP protocol {protocol!r} is not supported; set "
                                 f"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL to "
                                 f"{' or '.join(PROTOCOLS)}")
    return protocol


def exporter_endpoint(endpoint: str, protocol: str) -> str:
    """The URL the exporter posts to: over HTTP, `/v1/traces` when `endpoint` has no path
    (as OTEL_EXPORTER_OTLP_ENDPOINT is read); over gRPC, `endpoint` itself."""
    if protocol != "http/protobuf":
        return endpoint
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TracingUnavailable(f"--otlp-traces-endpoint {endpoint!r}: over http/protobuf it "
                                 "is an http:// or https:// URL")
    return endpoint.rstrip("/") + "/v1/traces" if parts.path in ("", "/") else endpoint


def check_tracing(endpoint: str, environ: Mapping[str, str] = os.environ) -> str:
    """The URL spans go to; raises TracingUnavailable for a bad protocol or endpoint, or
    unless the SDK and the protocol's exporter are installed (found, not imported)."""
    protocol = traces_protocol(environ)
    url = exporter_endpoint(endpoint, protocol)
    for module in ("opentelemetry.sdk", _MODULES[protocol]):
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            raise TracingUnavailable(f"--otlp-traces-endpoint needs the OpenTelemetry SDK and "
                                     f"its OTLP {protocol} exporter ({module} is missing): "
                                     f"{EXTRA_HINT}")
    return url


def start_tracing(endpoint: str, environ: Mapping[str, str] = os.environ) -> Tracing:
    """Spans exported to `endpoint` over the protocol the environment names."""
    url = check_tracing(endpoint, environ)
    protocol = traces_protocol(environ)
    # NOTE: imported here, not at the top: without the flag the SDK is never imported
    from gateway.tracing import otel

    return otel.OtelTracing(otel.make_exporter(url, protocol))


def incoming_context(headers: Mapping[str, str]) -> dict[str, str]:
    """The request's W3C trace context headers (those it sent)."""
    return {name: value for name in TRACE_HEADERS if (value := headers.get(name))}


class SpanCounts:
    """/metrics: spans exported and lost (a prometheus_client collector)."""

    def __init__(self, tracing: Tracing) -> None:
        self.tracing = tracing

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily("slicegate_trace_spans", "Request trace spans handed to "
                                     "the OTLP exporter, by result.", labels=["result"])
        exported, failed = self.tracing.counts
        family.add_metric(["exported"], exported)
        family.add_metric(["failed"], failed)
        yield family
