"""OTLP trace receivers for tests: a real HTTP/protobuf endpoint and a real gRPC one.

Each decodes what the exporter sends (`ExportTraceServiceRequest`) into `Received` spans:
ids as hex, attributes as Python values, the resource's attributes beside them.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2


@dataclass(frozen=True)
class Received:
    """One exported span as the receiver decoded it (times in Unix ns)."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: list[tuple[str, int, dict[str, Any]]]
    status_code: int
    resource: dict[str, Any]


def value_of(v: common_pb2.AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [value_of(x) for x in v.array_value.values]
    return getattr(v, which) if which else None


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: value_of(kv.value) for kv in kvs}


def decode(body: bytes) -> list[Received]:
    request = trace_service_pb2.ExportTraceServiceRequest()
    request.ParseFromString(body)
    return spans_of(request)


def spans_of(request: trace_service_pb2.ExportTraceServiceRequest) -> list[Received]:
    out = []
    for rs in request.resource_spans:
        resource = _attrs(rs.resource.attributes)
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(_received(s, resource))
    return out


def _received(s: trace_pb2.Span, resource: dict[str, Any]) -> Received:
    return Received(s.name, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(), s.kind,
                    s.start_time_unix_nano, s.end_time_unix_nano, _attrs(s.attributes),
                    [(e.name, e.time_unix_nano, _attrs(e.attributes)) for e in s.events],
                    s.status.code, resource)


class Collected:
    """Spans received so far (from the receiver's threads)."""

    def __init__(self) -> None:
        self.spans: list[Received] = []
        self.requests = 0
        self._lock = threading.Lock()

    def add(self, spans: list[Received]) -> None:
        with self._lock:
            self.spans += spans
            self.requests += 1

    def wait(self, count: int, timeout_s: float = 30) -> list[Received]:
        """At least `count` spans, waiting for the exporter's batches."""
        deadline = time.monotonic() + timeout_s
        while len(self.spans) < count:
            assert time.monotonic() < deadline, f"got {len(self.spans)} of {count} spans"
            time.sleep(0.02)
        with self._lock:
            return list(self.spans)


@contextmanager
def http_receiver() -> Iterator[tuple[str, Collected]]:
    """An OTLP/HTTP endpoint on loopback: (its base URL, what it received)."""
    collected = Collected()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            if self.headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            ok = self.path == "/v1/traces" and \
                self.headers.get("content-type") == "application/x-protobuf"
            if ok:
                collected.add(decode(body))
            reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200 if ok else 404)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", collected
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, collected: Collected) -> None:
        self.collected = collected

    def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 (the gRPC method)
        self.collected.add(spans_of(request))
        return trace_service_pb2.ExportTraceServiceResponse()


@contextmanager
def grpc_receiver() -> Iterator[tuple[str, Collected]]:
    """An OTLP/gRPC endpoint on loopback (plaintext): (its http:// URL, what it received)."""
    collected = Collected()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(collected), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"http://127.0.0.1:{port}", collected
    finally:
        server.stop(grace=None)
