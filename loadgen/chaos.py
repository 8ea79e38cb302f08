"""`python -m loadgen chaos`: the server under overload, faults, dropped streams, fuzzing, soak.

Each scenario starts its own slicegate server (`python -m gateway serve`, so RSS and KV
are its own), drives it over HTTP and reads it over HTTP (`/metrics`, `/admin/gmg`,
`/health`), then writes one `Row` (loadgen/chaos_report.py) with its goal:

- overload: capacity measured first (a closed loop of the batch shape, on its own
  server), then two interactive tenants with an SLO and two batch tenants, one flooding,
  at `overload_factor` x that capacity; goal: >= 99% of admitted interactive requests
  within their SLO, every refusal a 429/503 with Retry-After, no 5xx, nothing lost;
- faults: `--fault-rate` on the server; goal: every request completes or ends with a
  clear error, KV back to 0;
- drops: streams closed by the client at random points; goal: KV back to 0;
- fuzz: schemathesis against `/openapi.json`; goal: 0 server errors, 0 schema breaks;
- soak: 70% of capacity for `soak_s`; goal: RSS growth < 5% after warm-up.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from loadgen import chaos_probe as probe
from loadgen.chaos_report import Row, classify, mib
from loadgen.replay import ReplayConfig, ReplayResult, replay
from loadgen.servers import RunningServer, ServerSpec, free_port, slicegate_command
from loadgen.workload import parse_tenants

SCENARIOS = ("overload", "faults", "drops", "fuzz", "soak")
ADMIN_KEY = "sk-chaos-admin"
INTERACTIVE, BATCH = ("chat-a", "chat-b"), ("batch-flood", "batch-b")
PromptFn = Callable[[int, str], str]


@dataclass(frozen=True, slots=True)
class ChaosConfig:
    """Scale and shape of every scenario; `short()` is the test run's variant."""

    out: Path
    model: str = "default"
    serve_cmd: tuple[str, ...] = ()  # default: python -m gateway serve
    devices: str | None = None
    dtype: str | None = None
    max_model_len: int | None = 1024
    extra_serve_args: tuple[str, ...] = ()
    scenarios: tuple[str, ...] = SCENARIOS
    slo_ms: float = 1000.0  # interactive tenants' TTFT SLO
    prompt_tokens: int = 64  # interactive and batch requests
    output_tokens: int = 16
    capacity_s: float = 20.0
    capacity_concurrency: int = 8
    overload_factor: float = 10.0
    overload_s: float = 60.0
    queue_drain_s: float = 15.0  # waiting queues hold about this much work (at capacity)
    fault_rate: float = 0.01
    fault_requests: int = 300
    drops: int = 1000
    fuzz_cases: int = 10_000
    soak_s: float = 1800.0
    soak_load: float = 0.7
    ready_timeout_s: float = 900.0
    seed: int = 0
    capacity_rps: float | None = None  # known capacity (skips measuring)

    @classmethod
    def short(cls, out: Path, **kw: Any) -> ChaosConfig:
        """The normal test run's variant: the tiny model, seconds per scenario."""
        base = cls(out, model="tiny-random", dtype="float32", max_model_len=256,
                   extra_serve_args=("--device-memory-gib", "0.25"), slo_ms=1000.0,
                   prompt_tokens=64, output_tokens=128, capacity_s=4.0, overload_s=12.0,
                   fault_rate=0.05, fault_requests=40, drops=120, fuzz_cases=300, soak_s=20.0,
                   ready_timeout_s=120.0, queue_drain_s=5.0)
        return replace(base, **kw)


TENANTS_YAML = """\
admin_keys: [{admin}]
tenants:
  - {{name: chat-a, api_keys: [sk-chat-a], priority: high, ttft_slo_ms: {slo}}}
  - {{name: chat-b, api_keys: [sk-chat-b], priority: high, ttft_slo_ms: {slo}}}
  - {{name: batch-flood, api_keys: [sk-batch-flood], priority: low}}
  - {{name: batch-b, api_keys: [sk-batch-b], priority: low}}
"""


@dataclass(slots=True)
class Server:
    """A started server and what chaos knows about it."""

    running: RunningServer
    url: str
    client: httpx.AsyncClient = field(init=False)

    def __post_init__(self) -> None:
        self.client = httpx.AsyncClient(base_url=self.url, timeout=30.0)


class Chaos:
    """Runs the scenarios of `cfg` one after another."""

    def __init__(self, cfg: ChaosConfig, prompt: PromptFn) -> None:
        self.cfg, self.prompt = cfg, prompt
        cfg.out.mkdir(parents=True, exist_ok=True)
        self.tenants_file = cfg.out / "tenants.yaml"
        self.tenants_file.write_text(TENANTS_YAML.format(admin=ADMIN_KEY, slo=cfg.slo_ms))
        self.capacity_rps = cfg.capacity_rps

    def start(self, name: str, *extra: str) -> Server:
        port = free_port()
        cfg = self.cfg
        serve = cfg.serve_cmd or ("python", "-m", "gateway", "serve")
        command = slicegate_command(
            serve, model=cfg.model, policy="slice", tenants=self.tenants_file, port=port,
            devices=cfg.devices, dtype=cfg.dtype, max_model_len=cfg.max_model_len,
            extra=(*cfg.extra_serve_args, "--log-level", "warning",
                   "--data-dir", str(cfg.out / f"data-{name}"), *extra))
        spec = ServerSpec(name, command, port, ready_timeout_s=cfg.ready_timeout_s,
                          model=cfg.model, stop_timeout_s=60.0)
        running = RunningServer(spec, cfg.out / f"server-{name}.log")
        try:
            running.wait_ready()
        except Exception:
            running.stop()
            raise
        return Server(running, spec.url)

    # -- helpers ---------------------------------------------------------------------------
    def tenants(self, rates: dict[str, float], duration_s: float) -> ReplayConfig:
        c = self.cfg
        specs = [f"{name}:sk-{name}:rate={rate:.4f},prompt={c.prompt_tokens},"
                 f"gen={c.output_tokens},seed={c.seed + i}" for i, (name, rate)
                 in enumerate(rates.items()) if rate > 0]
        return ReplayConfig("", tuple(parse_tenants(specs)), duration_s=duration_s,
                            drain_timeout_s=max(120.0, 4 * c.queue_drain_s),
                            request_timeout_s=600.0, admin_key="", progress=False)

    async def run_load(self, server: Server, config: ReplayConfig) -> ReplayResult:
        return await replay(replace(config, url=server.url), self.prompt)

    async def measure_capacity(self) -> float:
        """Completed batch-shaped requests per second with a closed loop saturating the server."""
        if self.capacity_rps is not None:
            return self.capacity_rps
        c = self.cfg
        server = self.start("capacity")
        try:
            spec = (f"batch-b:sk-batch-b:concurrency={c.capacity_concurrency},"
                    f"prompt={c.prompt_tokens},gen={c.output_tokens}")
            config = ReplayConfig(server.url, tuple(parse_tenants([spec])),
                                  duration_s=c.capacity_s, drain_timeout_s=60.0,
                                  warmup_requests=2, progress=False)
            result = await replay(config, self.prompt)
        finally:
            await server.client.aclose()
            server.running.stop()
        done = [r for r in result.records if r.ok and (r.end_s or 0) <= result.window_s]
        self.capacity_rps = max(len(done) / max(result.window_s, 1e-9), 0.1)
        return self.capacity_rps

    def queue_flags(self, capacity_rps: float) -> tuple[str, ...]:
        """Queues that hold about `queue_drain_s` of work at the measured capacity."""
        n = max(8, math.ceil(capacity_rps * self.cfg.queue_drain_s))
        return ("--max-queued-requests", f"high={n},normal={n},low={n},total={n}")

    async def finish_row(self, row: Row, server: Server, watch: probe.HealthWatch,
                         started: float) -> Row:
        """Stop watching, wait (<= 30 s) for KV to drain, read the server's end state."""
        await watch.stop()
        deadline = time.monotonic() + 30.0
        while (kv := await probe.kv_blocks_in_use(server.client, ADMIN_KEY)) and \
                time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        row.kv_blocks_after = kv
        row.rss_end_mib = mib(await probe.rss_bytes(server.client))
        row.jain = await probe.jain(server.client)
        row.details["server_slo_attainment"] = await probe.server_slo_attainment(server.client)
        row.details["server_shed"] = await probe.shed_counts(server.client)
        row.healthy = watch.failed == 0 and await probe.healthy(server.client)
        row.details["health_polls"] = watch.polls
        row.seconds = round(time.monotonic() - started, 1)
        return row

    async def with_server(self, name: str, body: Callable[[Server, Row], Any], goal: str,
                          *flags: str) -> Row:
        """Start a server, warm it, run `body`, read the end state, stop it."""
        started = time.monotonic()
        server = self.start(name, *flags)
        row = Row(name, goal, False, classify(()))
        watch = probe.HealthWatch(server.client)
        try:
            await self.run_load(server, self.tenants({"batch-b": 2.0}, 1.0))  # warm-up
            row.rss_start_mib = mib(await probe.rss_bytes(server.client))
            watch.start()
            await body(server, row)
            return await self.finish_row(row, server, watch, started)
        except httpx.HTTPError as exc:  # NOTE: the server died (e.g. killed for memory)
            await watch.stop()
            row.healthy, row.met = False, False
            row.details["error"] = f"{type(exc).__name__}: {exc}"
            return row
        finally:
            await server.client.aclose()
            row.details["exit_code"] = server.running.stop()
