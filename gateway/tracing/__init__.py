"""OpenTelemetry traces of requests (`--otlp-traces-endpoint`).

`setup` turns the setting on (and is all the rest of the gateway imports), `spans`
builds a finished job's span as plain data, `otel` exports it with the OpenTelemetry SDK,
which is imported only when tracing is on. See docs/operations/tracing.md.
"""
