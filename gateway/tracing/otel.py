"""Exporting request spans with the OpenTelemetry SDK (the `otel` extra).

`OtelTracing` owns a private `TracerProvider` whose `BatchSpanProcessor` exports over OTLP
(HTTP/protobuf or gRPC) from its own thread, off the request path: `record` only builds
the spans and queues them. Only `gateway.tracing.setup` imports this module, and only when
`--otlp-traces-endpoint` is given.

NOTE: the provider is not installed as OpenTelemetry's global one: FastAPI (0.165 here) traces
every request itself through the global provider when one is set, which would add its own
spans (and their cost) beside these.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gateway.job import Job
from gateway.tracing.spans import SpanSpec, request_span
from gateway.version import package_version

logger = logging.getLogger(__name__)


def make_exporter(endpoint: str, protocol: str) -> SpanExporter:
    """The OTLP span exporter for `protocol` (`OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, checked
    by `gateway.tracing.setup.traces_protocol`): grpc, else http/protobuf."""
    if protocol == "grpc":
        return GrpcSpanExporter(endpoint=endpoint)
    return HttpSpanExporter(endpoint=endpoint)


class CountingExporter(SpanExporter):
    """Wraps an exporter: counts spans exported and lost, and logs a failed export."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self.exported = 0
        self.failed = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.inner.export(spans)
        except Exception:
            logger.exception("exporting %d span(s) raised", len(spans))
            result = SpanExportResult.FAILURE
        if result is SpanExportResult.SUCCESS:
            self.exported += len(spans)
        else:
            self.failed += len(spans)
            logger.warning("%d span(s) could not be exported (%d lost so far)", len(spans),
                           self.failed)
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


class OtelTracing:
    """Request spans exported over OTLP: `record` a finished job, `shutdown` at the end."""

    def __init__(self, exporter: SpanExporter) -> None:
        self.exporter = CountingExporter(exporter)
        resource = Resource.create({"service.name": "slicegate",
                                    "service.version": package_version()})
        self.provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        self.provider.add_span_processor(BatchSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("slicegate", package_version())
        self._propagator = TraceContextTextMapPropagator()

    def record(self, job: Job, end: float) -> None:
        """Queue the span of `job` (ended at monotonic `end`), a child of its trace context."""
        self.emit(request_span(job, end), job.trace_headers)

    def emit(self, spec: SpanSpec, carrier: Mapping[str, str]) -> None:
        parent = self._propagator.extract(carrier) if carrier else None
        offset_ns = time.time_ns() - time.monotonic_ns()  # monotonic -> Unix ns
        span = self._start(spec, parent, SpanKind.SERVER, offset_ns)
        for event in spec.events:
            span.add_event(event.name, event.attributes, _ns(event.time, offset_ns))
        inside = set_span_in_context(span)
        for child in spec.children:
            self._start(child, inside, SpanKind.INTERNAL, offset_ns).end(_ns(child.end,
                                                                               offset_ns))
        if spec.error is not None:
            span.set_status(Status(StatusCode.ERROR, spec.error))
        span.end(_ns(spec.end, offset_ns))

    def _start(self, spec: SpanSpec, parent: Context | None, kind: SpanKind,
               offset_ns: int) -> Span:
        return self.tracer.start_span(spec.name, context=parent, kind=kind,
                                      attributes=spec.attributes,
                                      start_time=_ns(spec.start, offset_ns))

    @property
    def counts(self) -> tuple[int, int]:
        """(spans exported, spans lost) so far."""
        return self.exporter.exported, self.exporter.failed

    def shutdown(self) -> None:
        """Export what is queued (a few seconds at most), then stop the export thread."""
        self.provider.shutdown()


def _ns(monotonic_s: float, offset_ns: int) -> int:
    return int(monotonic_s * 1e9) + offset_ns
