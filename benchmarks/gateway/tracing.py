"""`python -m benchmarks.gateway tracing`: what request tracing adds to a request's latency.

Two gateways alike but for `--otlp-traces-endpoint` (pointing at an OTLP/HTTP sink in this
process, which keeps what it is sent and decodes it after the timing, to check that every
traced request's span arrived) get short non-streamed completions (`--tokens`, default 1)
in pairs, one request to each, alternating which goes first; every request carries a W3C
`traceparent`. A pair's difference is traced minus untraced latency; the table gives, per
round of `--pairs` pairs, each arm's median latency and the median pair difference, then
the median over the rounds.

`--engine fake` (the default) isolates the gateway: each app runs over its own
`FakeScheduler` (no model; a token per step at once), so the difference is the span's
building and export (the exporter's thread shares the process) without a model's step
noise. `--engine model` runs both apps over one real engine (the model, its scheduler and
devices): the difference then also holds the scheduler's plan journal, within the noise
of the model's steps. Both call the apps through `httpx.ASGITransport`, in this process
(no sockets: what tracing adds is in the app). The journal's cost per plan is timed
alone too (`journal_step_s`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import statistics
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from benchmarks.harness import machine, machine_line, parser, print_table, write_json
from gateway.app import create_app
from gateway.config import BatchSettings, GatewayConfig, SchedulerSettings, load_config
from gateway.engine import Engine, build_engine, eos_ids, load_tokenizer
from models.default_model import prepare_default
from scheduler.core.journal import PlanJournal
from scheduler.testing.fake import FakeConfig, FakeScheduler

PROMPT = "The three primary colours are"
ARMS = ("off", "on")
Call = Callable[[str], Awaitable[float]]  # arm -> one request's wall seconds


class SpanSink:
    """What an OTLP/HTTP exporter sent; decoded only when asked, after the timing."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.lock = threading.Lock()

    def request_spans(self) -> int:
        """Spans with `gen_ai.operation.name` (one per traced request)."""
        n = 0
        for body in self.bodies:
            request = trace_service_pb2.ExportTraceServiceRequest()
            request.ParseFromString(body)
            n += sum(1 for rs in request.resource_spans for ss in rs.scope_spans
                     for s in ss.spans
                     if any(a.key == "gen_ai.operation.name" for a in s.attributes))
        return n


@contextmanager
def otlp_sink() -> Iterator[tuple[str, SpanSink]]:
    """An OTLP/HTTP endpoint on loopback that keeps what it is sent."""
    sink = SpanSink()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            with sink.lock:
                sink.bodies.append(body)
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", sink
    finally:
        server.shutdown()
        server.server_close()


async def latency_s(client: httpx.AsyncClient, model: str, tokens: int) -> float:
    """One non-streamed completion's wall time, with a fresh `traceparent`."""
    header = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
    t0 = time.perf_counter()
    r = await client.post("/v1/completions", headers={"traceparent": header}, json={
        "model": model, "prompt": PROMPT, "max_tokens": tokens, "temperature": 0,
        "min_tokens": tokens, "ignore_eos": True})
    elapsed = time.perf_counter() - t0
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == tokens
    return elapsed


async def paired_round(call: Call, pairs: int) -> dict[str, list[float]]:
    """`pairs` pairs (off, on), alternating which arm goes first."""
    out: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for i in range(pairs):
        for arm in ARMS if i % 2 == 0 else ARMS[::-1]:
            out[arm].append(await call(arm))
    return out


def arm_configs(base: GatewayConfig, sink_url: str, tmp: str) -> dict[str, GatewayConfig]:
    """The two arms' configs: alike but for the endpoint (and each its own data dir)."""
    traced = dataclasses.replace(base.server, otlp_traces_endpoint=sink_url)
    return {"off": dataclasses.replace(base, batch=BatchSettings(f"{tmp}/off")),
            "on": dataclasses.replace(base, batch=BatchSettings(f"{tmp}/on"), server=traced)}


@asynccontextmanager
async def fake_clients(sink_url: str) -> AsyncIterator[dict[str, Any]]:
    """Both arms' apps over a FakeScheduler each, behind ASGI clients."""
    tokenizer = load_tokenizer(prepare_default())
    with tempfile.TemporaryDirectory() as tmp:
        base = GatewayConfig(scheduler=SchedulerSettings(devices=("cpu:0",)))
        engines = {arm: Engine(tokenizer, FakeScheduler(FakeConfig(vocab_size=len(tokenizer))),
                               "fake", 2048, len(tokenizer), eos_ids(tokenizer))
                   for arm in ARMS}
        apps = {arm: create_app(config, engines[arm])
                for arm, config in arm_configs(base, sink_url, tmp).items()}
        async with _clients(apps, started=ARMS) as clients:
            yield clients


@asynccontextmanager
async def model_clients(sink_url: str, args: Any) -> AsyncIterator[dict[str, Any]]:
    """Both arms' apps over one real engine (its scheduler and model), behind ASGI clients.

    NOTE: the untraced app's lifespan starts the engine's scheduler; the traced app runs
    without its own (a second start of one scheduler), and its exporter is flushed at the
    end instead. Both arms thus share the model, its kernels and its devices."""
    base = load_config(None, {"model.spec": args.model, "scheduler.devices": args.devices})
    engine = build_engine(base)
    with tempfile.TemporaryDirectory() as tmp:
        apps = {arm: create_app(config, engine)
                for arm, config in arm_configs(base, sink_url, tmp).items()}
        try:
            async with _clients(apps, started=("off",)) as clients:
                yield clients
        finally:
            tracing = apps["on"].state.gateway.tracing
            await asyncio.to_thread(tracing.shutdown)


@asynccontextmanager
async def _clients(apps: dict[str, Any], started: tuple[str, ...]
                   ) -> AsyncIterator[dict[str, Any]]:
    """An ASGI client per app, with the lifespans of the `started` apps running."""
    async with AsyncExitStack() as stack:
        for arm in started:
            await stack.enter_async_context(apps[arm].router.lifespan_context(apps[arm]))
        yield {arm: await stack.enter_async_context(httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://gateway", timeout=120))
            for arm, app in apps.items()}


async def measure(args: Any, sink_url: str) -> list[dict[str, float]]:
    clients_of = (fake_clients(sink_url) if args.engine == "fake"
                  else model_clients(sink_url, args))
    rounds = []
    async with clients_of as clients:
        model = (await clients["off"].get("/v1/models")).json()["data"][0]["id"]

        async def call(arm: str) -> float:
            return await latency_s(clients[arm], model, args.tokens)

        await paired_round(call, args.pairs)  # warm-up
        for _ in range(args.repeats):
            times = await paired_round(call, args.pairs)
            diffs = [b - a for a, b in zip(times["off"], times["on"], strict=True)]
            rounds.append({"off_s": statistics.median(times["off"]),
                           "on_s": statistics.median(times["on"]),
                           "diff_s": statistics.median(diffs)})
    return rounds


def journal_step_s(steps: int = 100_000, repeats: int = 5) -> float:
    """What a traced request's decode step adds in the scheduler: `PlanJournal.issued` and
    `done` (the folding into runs), median of `repeats` timings of `steps` steps."""
    times = []
    for _ in range(repeats):
        journal = PlanJournal()
        t0 = time.perf_counter()
        for i in range(steps):
            journal.issued("decode", ("cpu:0",), float(i), 1, 1)
            journal.done(i + 0.5)
        times.append((time.perf_counter() - t0) / steps)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser("python -m benchmarks.gateway tracing", __doc__)
    p.add_argument("--engine", choices=("fake", "model"), default="fake",
                   help="fake: each app over a FakeScheduler (the gateway's cost alone); "
                        "model: both apps over one real engine (default: fake)")
    p.add_argument("--model", default="default", help="--engine model: the served model")
    p.add_argument("--devices", default="cpu:0",
                   help="--engine model: the engine's devices (default cpu:0)")
    p.add_argument("--tokens", type=int, default=1, help="output tokens per request")
    p.add_argument("--pairs", type=int, default=200, help="request pairs per round")
    p.add_argument("--repeats", type=int, default=5, help="rounds after one warm-up round")
    args = p.parse_args(argv)
    for name in ("httpx", "uvicorn.access"):  # a line per request otherwise
        logging.getLogger(name).setLevel(logging.WARNING)
    print(machine_line())
    with otlp_sink() as (sink_url, sink):
        rounds = asyncio.run(measure(args, sink_url))
        traced = sink.request_spans()  # the traced arm flushed its spans when it stopped
    sent = (args.repeats + 1) * args.pairs
    assert traced == sent, f"the sink got {traced} request spans of {sent} traced requests"
    print_table(("round", "untraced median (ms)", "traced median (ms)",
                 "median pair difference (ms)"), "rrrr",
                ((i + 1, f"{r['off_s'] * 1e3:.3f}", f"{r['on_s'] * 1e3:.3f}",
                  f"{r['diff_s'] * 1e3:+.3f}") for i, r in enumerate(rounds)))
    overhead = statistics.median(r["diff_s"] for r in rounds)
    journal_s = journal_step_s()
    print(f"\ntracing overhead per request ({args.engine}; median of {args.repeats} rounds "
          f"of {args.pairs} pairs): {overhead * 1e3:+.3f} ms; request spans received: "
          f"{traced} of {sent}; the scheduler's journal: {journal_s * 1e6:.2f} us per plan "
          "of a traced request")
    result = {**machine(), "engine": args.engine, "model": args.model,
              "devices": args.devices, "tokens": args.tokens, "pairs": args.pairs,
              "repeats": args.repeats, "rounds": rounds, "overhead_s": overhead,
              "request_spans": traced, "journal_step_s": journal_s}
    write_json(args.json, result)
    return result
