"""``python -m loadgen bench-models``: two models on one machine, three ways (issue 43 item 4).

Two instances of one base model: ``chat`` serves an interactive tenant (a
trace replay, priority high, a TTFT SLO) and ``batch`` a batch tenant (a
closed loop, priority low). The same workload runs against each layout:

1. ``slice``: one slicegate serving both models on both devices
   (``--model chat=M --model batch=M --devices cpu:0,cpu:1``); the tenants
   file gives each tenant its ``default_model`` and requests name it too.
2. ``static``: the static split, one slicegate per model, each with one device
   (``--devices cpu:0`` / ``cpu:1``), one intra-op thread (``--cpu-threads 1``)
   and, with ``pin``, its process bound to that core (``taskset -c N``).
3. ``vllm``: two vLLM CPU servers (``loadgen/peers/vllm-cpu.sh``), one per
   model, sharing the machine; with ``pin`` each is bound to one core
   (``taskset -c N``) and binds its OpenMP threads to it
   (``VLLM_CPU_OMP_THREADS_BIND=N``).

Each layout's servers are started fresh and stopped by PID; the two tenants
are two concurrent replays (one per server where there are two), so each
replay's report stays its tenant's. ``bench.md`` / ``bench.json`` hold one row
per layout (interactive SLO attainment and TTFT, batch model tok/s, its ratios
to ``static`` and ``vllm``) and the goals; ``runs/LAYOUT/{interactive,batch}/``
each replay's report, ``runs/LAYOUT/server-*.log`` the servers' logs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
import shutil
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from loadgen.bench import (
    ADMIN_KEY,
    BATCH,
    INTERACTIVE,
    KEYS,
    cached_prompts,
    write_tenants_file,
)
from loadgen.benchtable import RunOutcome, summarize_run
from loadgen.modelstable import format_models_markdown, models_summary
from loadgen.plots import write_plots
from loadgen.prompts import resolve_model_folder
from loadgen.recipes import SATURATING_BATCH, default_interactive
from loadgen.replay import PromptFn, ReplayConfig, ReplayResult, replay
from loadgen.report import write_report
from loadgen.servers import (
    PEERS_DIR,
    RunningServer,
    ServerError,
    ServerSpec,
    default_serve_cmd,
    free_port,
    peer_spec,
    slicegate_command,
)
from loadgen.workload import ClosedLoop, TenantSpec, parse_source, plan_arrivals

LAYOUTS = ("slice", "static", "vllm")
MODEL_NAMES = {INTERACTIVE: "chat", BATCH: "batch"}  # tenant -> the model it runs on


@dataclass(frozen=True, slots=True)
class ModelsBenchConfig:
    """A two-model bench: which layouts, on which model and workload, and where to write."""

    out: Path
    layouts: tuple[str, ...] = LAYOUTS
    model: str = "default"  # both instances' spec; its folder also serves vLLM
    devices: tuple[str, str] = ("cpu:0", "cpu:1")  # chat's and batch's in the static split
    dtype: str = "bfloat16"  # the vLLM peer script serves bfloat16
    max_model_len: int = 2048  # and 2048
    interactive: str | None = None  # a tenant SOURCE; None: the saturating recipe's trace
    max_requests: int | None = None  # the recipe's trace cut to its first N (short runs)
    span_s: float | None = None  # the recipe's trace cut to its first S seconds of replay
    batch: str = SATURATING_BATCH  # a closed-loop tenant SOURCE
    slo_ms: float = 500.0  # the interactive tenant's TTFT SLO, every layout held to it
    policy: str = "slice"  # slicegate --policy in the slice and static layouts
    tail_s: float = 2.0  # the batch tenant sends until the last interactive arrival + this
    pin: bool = True  # static and vllm: each server on one core of its own
    serve_cmd: tuple[str, ...] = field(default_factory=default_serve_cmd)
    serve_args: tuple[str, ...] = ()  # extra flags for every slicegate server
    peers_dir: Path = PEERS_DIR
    ready_timeout_s: float = 600.0
    peer_ready_timeout_s: float = 1800.0
    drain_timeout_s: float = 60.0
    request_timeout_s: float = 300.0
    warmup_requests: int = 2  # per tenant and layout, before the clock starts

    def __post_init__(self) -> None:
        unknown = [name for name in self.layouts if name not in LAYOUTS]
        if unknown or not self.layouts:
            raise ValueError(f"layouts must be some of {', '.join(LAYOUTS)}, got "
                             f"{','.join(self.layouts) or 'none'}")
        if len(self.devices) != 2 or self.devices[0] == self.devices[1]:
            raise ValueError(f"give two devices, one per model, got {self.devices}")
        if self.slo_ms <= 0:
            raise ValueError("--slo-ms must be > 0")
        if (self.max_requests, self.span_s) != (None, None) and self.interactive is not None:
            raise ValueError("--max-requests and --span-s cut the recipe's trace; with "
                             "--interactive give max_requests= or window_s= in its SOURCE")
        if not isinstance(parse_source(self.batch), ClosedLoop):
            raise ValueError(f"the batch tenant is a closed loop, got {self.batch!r}")


@dataclass(frozen=True, slots=True)
class Layout:
    """One layout's servers and where each tenant sends (server index, model name)."""

    name: str
    servers: tuple[ServerSpec, ...]
    targets: dict[str, tuple[int, str | None]]  # tenant -> (server, model; None: the first)
    admin_key: str  # "" for servers without slicegate's timeline
    note: str = ""


def core_of(device: str) -> int | None:
    """The core a ``cpu:N`` device is pinned to (N); None for other devices."""
    kind, _, index = device.partition(":")
    return int(index) if kind == "cpu" and index.isdigit() else None


def _pinned(command: tuple[str, ...], core: int | None, pin: bool) -> tuple[str, ...]:
    if not pin or core is None or shutil.which("taskset") is None:
        return command
    return ("taskset", "-c", str(core), *command)


def slice_layout(config: ModelsBenchConfig, port: int, tenants: Path) -> Layout:
    """One slicegate serving ``chat`` and ``batch`` on both devices."""
    command = slicegate_command(
        config.serve_cmd, model=f"{MODEL_NAMES[INTERACTIVE]}={config.model}",
        policy=config.policy, tenants=tenants, port=port, devices=",".join(config.devices),
        dtype=config.dtype, max_model_len=config.max_model_len,
        extra=("--model", f"{MODEL_NAMES[BATCH]}={config.model}",
               "--data-dir", str(tenants.parent / "data-slice"), *config.serve_args))
    spec = ServerSpec("slice", command, port, "/health", None, config.ready_timeout_s)
    return Layout("slice", (spec,), {t: (0, m) for t, m in MODEL_NAMES.items()}, ADMIN_KEY)


def static_layout(config: ModelsBenchConfig, ports: tuple[int, int], tenants: Path) -> Layout:
    """One slicegate per model, each on one device (and one core)."""
    servers = []
    for tenant, device, port in zip(MODEL_NAMES, config.devices, ports, strict=True):
        name = f"static-{MODEL_NAMES[tenant]}"
        # NOTE: each server its own data dir (Batch API files, tenant store): one holds its lock.
        command = slicegate_command(
            config.serve_cmd, model=config.model, policy=config.policy, tenants=tenants,
            port=port, devices=device, dtype=config.dtype, max_model_len=config.max_model_len,
            extra=("--cpu-threads", "1", "--data-dir", str(tenants.parent / f"data-{name}"),
                   *config.serve_args))
        servers.append(ServerSpec(name,
                                  _pinned(command, core_of(device), config.pin), port,
                                  "/health", None, config.ready_timeout_s))
    pinned = config.pin and shutil.which("taskset") is not None
    return Layout("static", tuple(servers), {INTERACTIVE: (0, None), BATCH: (1, None)},
                  ADMIN_KEY, note="" if pinned else "not pinned to cores")


def vllm_layout(config: ModelsBenchConfig, folder: Path, ports: tuple[int, int]) -> Layout:
    """Two vLLM CPU servers, one per model, each binding its threads to one core."""
    servers = []
    for tenant, device, port in zip(MODEL_NAMES, config.devices, ports, strict=True):
        spec = peer_spec("vllm", folder, port, config.peers_dir, config.peer_ready_timeout_s)
        core = core_of(device)
        env = (("VLLM_CPU_OMP_THREADS_BIND", str(core)),) if config.pin and core is not None \
            else ()
        # NOTE: the whole server on its core, as the static split's slicegate servers are (its
        # API server and engine core too, not only the OpenMP threads).
        servers.append(replace(spec, name=f"vllm-{MODEL_NAMES[tenant]}", env=env,
                               command=_pinned(spec.command, core, config.pin)))
    pinned = config.pin and shutil.which("taskset") is not None
    notes = [] if pinned else ["not pinned to cores" if not config.pin
                               else "threads bound, processes not pinned (no taskset)"]
    if (config.dtype, config.max_model_len) != ("bfloat16", 2048):
        notes.append("peer serves bfloat16, max model len 2048 (its script's settings)")
    return Layout("vllm", tuple(servers), {INTERACTIVE: (0, "peer"), BATCH: (1, "peer")}, "",
                  note="; ".join(notes))


def build_layout(config: ModelsBenchConfig, name: str, folder: Path, run_dir: Path) -> Layout:
    """The layout ``name`` on free ports, its tenants file written under ``run_dir``."""
    if name == "vllm":
        return vllm_layout(config, folder, (free_port(), free_port()))
    slo_s = config.slo_ms / 1000
    if name == "slice":
        return slice_layout(config, free_port(), write_tenants_file(
            run_dir / "tenants.yaml", slo_s, models=MODEL_NAMES))
    return static_layout(config, (free_port(), free_port()),
                         write_tenants_file(run_dir / "tenants.yaml", slo_s))


@dataclass(slots=True)
class _Bench:
    config: ModelsBenchConfig
    prompt: PromptFn
    folder: Path
    tenants: dict[str, TenantSpec]
    duration_s: float  # the batch tenant's sending time
    outcomes: dict[str, RunOutcome] = field(default_factory=dict)
    interrupted: bool = False


def run_models_bench(config: ModelsBenchConfig, command: str = "") -> dict[str, Any]:
    """Run every layout, write bench.md and bench.json, return the JSON document."""
    started_at = _now()
    if config.interactive is None:
        config = replace(config, max_requests=None, span_s=None, interactive=default_interactive(
            "saturating", config.max_requests, config.span_s))
    assert config.interactive is not None
    config.out.mkdir(parents=True, exist_ok=True)
    folder = resolve_model_folder(config.model)
    slo_s = config.slo_ms / 1000
    tenants = {INTERACTIVE: TenantSpec(INTERACTIVE, KEYS[INTERACTIVE],
                                       parse_source(config.interactive), priority=0,
                                       slo_s=slo_s),
               BATCH: TenantSpec(BATCH, KEYS[BATCH], parse_source(config.batch), priority=2)}
    arrivals = plan_arrivals(tenants[INTERACTIVE].source)
    bench = _Bench(config, cached_prompts(folder), folder, tenants,
                   duration_s=arrivals[-1].arrival_s + config.tail_s)
    try:
        for name in config.layouts:
            _run_layout(bench, name)
    except KeyboardInterrupt:
        bench.interrupted = True
    doc = {"command": command or f"run_models_bench({config!r})", "started_at": started_at,
           "finished_at": _now(), "interrupted": bench.interrupted,
           "config": {k: (str(v) if isinstance(v, Path) else v)
                      for k, v in asdict(config).items()},
           "model_folder": str(folder), "interactive_requests": len(arrivals),
           "batch_duration_s": bench.duration_s, "slo_s": slo_s,
           "runs": {name: o.to_json() for name, o in bench.outcomes.items()}}
    doc["summary"] = models_summary(bench.outcomes)
    (config.out / "bench.json").write_text(json.dumps(doc, indent=2) + "\n")
    (config.out / "bench.md").write_text(format_models_markdown(doc, bench.outcomes,
                                                                config.layouts))
    return doc


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _run_layout(bench: _Bench, name: str) -> RunOutcome:
    run_dir = bench.config.out / "runs" / name
    layout = build_layout(bench.config, name, bench.folder, run_dir)
    try:
        with contextlib.ExitStack() as stack:
            servers = []
            for spec in layout.servers:
                print(f"bench-models: {spec.name}: starting {shlex.join(spec.command)}",
                      flush=True)
                servers.append(stack.enter_context(
                    RunningServer(spec, run_dir / f"server-{spec.name}.log")))
            for server in servers:
                server.wait_ready()
            print(f"bench-models: {name}: ready, replaying", flush=True)
            results = asyncio.run(_replay_both(bench, layout))
    except (ServerError, RuntimeError, OSError) as exc:
        return _record(bench, RunOutcome.failed(name, str(exc), layout.note))
    return _record(bench, _outcome(bench, layout, results, run_dir))


async def _replay_both(bench: _Bench, layout: Layout) -> dict[str, ReplayResult]:
    """The two tenants' replays at once; the batch one sends for ``bench.duration_s``."""
    configs = {}
    for tenant, (index, model) in layout.targets.items():
        spec = layout.servers[index]
        # NOTE: one timeline per slicegate server: the batch replay polls its own only.
        own = tenant == INTERACTIVE or len(layout.servers) > 1
        configs[tenant] = ReplayConfig(
            url=spec.url, tenants=(bench.tenants[tenant],), model=model,
            duration_s=bench.duration_s if tenant == BATCH else None,
            drain_timeout_s=bench.config.drain_timeout_s,
            request_timeout_s=bench.config.request_timeout_s,
            admin_key=layout.admin_key if own else "", dialect=spec.dialect,
            warmup_requests=bench.config.warmup_requests)
    results = await asyncio.gather(*(replay(c, bench.prompt) for c in configs.values()))
    return dict(zip(configs, results, strict=True))


def _outcome(bench: _Bench, layout: Layout, results: dict[str, ReplayResult],
             run_dir: Path) -> RunOutcome:
    reports = {}
    for tenant, result in results.items():
        reports[tenant] = write_report(result, run_dir / tenant)
        write_plots(result, run_dir / tenant, {INTERACTIVE: bench.config.slo_ms / 1000})
    summary = summarize_run(reports[INTERACTIVE], INTERACTIVE, BATCH)
    batch = summarize_run(reports[BATCH], INTERACTIVE, BATCH)
    summary.update(lp_tok_s=batch["lp_tok_s"], errors=summary["errors"] + batch["errors"],
                   total_tok_s=summary["total_tok_s"] + batch["total_tok_s"],
                   servers=[shlex.join([*(f"{k}={v}" for k, v in s.env), *s.command])
                            for s in layout.servers])
    return RunOutcome(layout.name, summary, note=layout.note, result=results[INTERACTIVE],
                      report_path=run_dir / INTERACTIVE / "report.md")


def _record(bench: _Bench, outcome: RunOutcome) -> RunOutcome:
    bench.outcomes[outcome.name] = outcome
    status = "ok" if outcome.ok else f"FAILED: {outcome.reason}"
    print(f"bench-models: {outcome.name}: {status}", flush=True)
    return outcome
