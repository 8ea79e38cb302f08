"""``python -m loadgen bench``: slicegate's policies and peer servers side by side.

1. The interactive tenant alone under ``--alone-policy`` (default ``static``:
   its own share of the devices, the SliceScheduler paper's Static-Online; or
   ``slice``: the floor a mixed run is compared with): its p90 TTFT times
   ``--slo-factor`` is the interactive SLO (unless ``--slo-ms`` gives one).
2. For each policy, slicegate is started as a subprocess with a tenants file
   holding that SLO, the same mixed workload (interactive trace + a batch
   tenant) is replayed, and the server is stopped by PID.
3. Each peer (``loadgen/peers/*.sh``, same model folder) gets the same
   workload and is held to the same absolute SLO.
4. One table side by side, with ratios to ``fcfs``: ``bench.md``,
   ``bench.json``, overlay plots; each run's own report under ``runs/NAME/``.
   A second table gives each run's interactive TTFT p50 / p90 / p99 and TPOT.

``--batch none`` replays the interactive tenant alone on every server (the
latency floor side by side: slicegate against vLLM on the same stream).
"""

from __future__ import annotations

import asyncio
import json
import shlex
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from loadgen.benchtable import (
    RunOutcome,
    format_bench_markdown,
    summarize_run,
    write_bench_plots,
)
from loadgen.plots import write_plots
from loadgen.prompts import PromptBuilder, resolve_model_folder
from loadgen.recipes import RECIPES, default_interactive, recipe_defaults
from loadgen.replay import PromptFn, ReplayConfig, replay
from loadgen.report import slo_attainment, write_report
from loadgen.saturating import PEER, saturating_lines, saturating_summary
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
from loadgen.sweep import Setting, sweep_lines
from loadgen.traces import TraceRequest
from loadgen.workload import TenantSpec, parse_source, plan_arrivals

NO_CACHE = "-no-cache"  # suffix of a run served with --no-prefix-cache
INTERACTIVE, BATCH = "interactive", "batch"
KEYS = {INTERACTIVE: "sk-bench-interactive", BATCH: "sk-bench-batch"}
ADMIN_KEY = "sk-bench-admin"


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """A bench: what to run, on which model and workload, and where to write."""

    out: Path
    policies: tuple[str, ...] = ("fcfs", "priority", "static", "slice")
    peers: tuple[str, ...] = ("vllm",)  # "vllm", "transformers"; the table always has vllm
    model: str = "default"  # slicegate --model; its folder also serves the peers
    devices: str | None = None  # slicegate --devices; None: its default
    dtype: str = "bfloat16"  # the peer scripts serve bfloat16
    max_model_len: int = 2048  # the vLLM peer script serves 2048
    interactive: str | None = None  # a tenant SOURCE; None: default_interactive(recipe)
    recipe: str = "default"  # the interactive trace's shape when `interactive` is None
    max_requests: int | None = None  # the recipe's trace cut to its first N (short runs)
    span_s: float | None = None  # the recipe's trace cut to its first S seconds of replay
    batch: str = "concurrency=16,prompt=512,gen=64"  # a tenant SOURCE; "none": interactive alone
    tail_s: float = 2.0  # mixed runs send batch work until the last interactive arrival + this
    slo_ms: float | None = None  # None: measured by the alone run
    alone_policy: str = "static"  # the policy of the alone run that sets the SLO
    slo_factor: float = 1.0  # SLO = this x the alone run's interactive p90 TTFT
    # the interactive tenant's tenants-file `tpot_slo_ms`, fixed or this x its TPOT p50 alone;
    # both None: the field is not written (a server that predates it refuses it)
    tpot_slo_ms: float | None = None
    tpot_slo_factor: float | None = None
    serve_cmd: tuple[str, ...] = field(default_factory=default_serve_cmd)
    serve_args: tuple[str, ...] = ()  # extra flags for every slicegate run
    peers_dir: Path = PEERS_DIR
    ready_timeout_s: float = 600.0
    peer_ready_timeout_s: float = 1800.0  # first use installs the peer's venv
    drain_timeout_s: float = 60.0
    request_timeout_s: float = 300.0
    warmup_requests: int = 2  # per tenant and run, before the clock starts
    # policies run once more with --no-prefix-cache; None: slice under the mooncake recipe
    no_cache_policies: tuple[str, ...] | None = None
    sweep: tuple[Setting, ...] = ()  # slice runs with flags of their own (loadgen/sweep.py)

    def __post_init__(self) -> None:
        if not self.policies and not self.peers and not self.sweep:
            raise ValueError("nothing to run: give --policies, --peers and/or --sweep")
        if clash := {n for n, _ in self.sweep} & {*self.policies, *self.peers,
                                                 self.alone_run}:
            raise ValueError(f"sweep run names must differ from the other runs': {clash}")
        for peer in self.peers:
            if peer not in ("vllm", "transformers"):
                raise ValueError(f"unknown peer {peer!r} (known: vllm, transformers)")
        if self.recipe not in RECIPES:
            raise ValueError(f"unknown recipe {self.recipe!r} (known: {', '.join(RECIPES)})")
        ratios_to = recipe_defaults(self.recipe).ratios_to
        if ratios_to == "fcfs" and "fcfs" not in self.policies and self.batch.strip() != "none":
            raise ValueError("the table's ratios are to fcfs: include fcfs in --policies")
        if self.slo_factor <= 0:
            raise ValueError("--slo-factor must be > 0")
        if self.tpot_slo_ms is not None and self.tpot_slo_factor is not None:
            raise ValueError("give a TPOT SLO in ms or as a factor of the alone TPOT, not both")
        for name in ("tpot_slo_ms", "tpot_slo_factor", "max_requests", "span_s"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        if (self.max_requests, self.span_s) != (None, None) and self.interactive is not None:
            raise ValueError("--max-requests and --span-s cut the recipe's trace; with "
                             "--interactive give max_requests= or window_s= in its SOURCE")

    @classmethod
    def for_recipe(cls, out: Path, recipe: str = "default", **given: Any) -> BenchConfig:
        """A bench of ``recipe``: the recipe's defaults where ``given`` has no value (None)."""
        preset = recipe_defaults(recipe)
        chosen: dict[str, Any] = {"policies": preset.policies, "batch": preset.batch,
                                  "slo_ms": preset.slo_ms, "alone_policy": preset.alone_policy}
        chosen.update({k: v for k, v in given.items() if v is not None})
        return cls(out=out, recipe=recipe, **{k: v for k, v in chosen.items() if v is not None})

    @property
    def needs_alone_run(self) -> bool:
        """Whether the interactive tenant runs alone first (for its SLO or its TPOT alone)."""
        return (self.slo_ms is None or self.tpot_slo_factor is not None
                or recipe_defaults(self.recipe).always_alone)

    @property
    def alone_run(self) -> str:
        return f"{self.alone_policy}-alone"

    @property
    def no_cache_runs(self) -> tuple[str, ...]:
        """Policies run again without the prefix cache."""
        if self.no_cache_policies is not None:
            return self.no_cache_policies
        return ("slice",) if self.recipe == "mooncake" and "slice" in self.policies else ()


@dataclass(slots=True)
class _Bench:
    config: BenchConfig
    prompt: PromptFn
    folder: Path
    interactive: TenantSpec
    batch: TenantSpec | None  # None: the interactive tenant alone in every run
    duration_s: float
    outcomes: dict[str, RunOutcome] = field(default_factory=dict)
    interrupted: bool = False
    tpot_slo_s: float | None = None  # the interactive tenant's, once known

    def tenants(self) -> tuple[TenantSpec, ...]:
        """The tenants of every run after the alone one."""
        return (self.interactive,) if self.batch is None else (self.interactive, self.batch)


def run_bench(config: BenchConfig, command: str = "") -> dict[str, Any]:
    """Run every policy and peer, write the bench files, return the bench JSON.

    Ctrl-C stops the run in progress (its report is kept), skips the rest and
    still writes the bench files; ``doc["interrupted"]`` is then true.
    ``command`` is recorded as the command line that ran the bench.
    """
    started_at = _now()
    if config.interactive is None:
        config = replace(config, max_requests=None, span_s=None, interactive=default_interactive(
            config.recipe, config.max_requests, config.span_s))
    assert config.interactive is not None
    config.out.mkdir(parents=True, exist_ok=True)
    folder = resolve_model_folder(config.model)
    interactive = TenantSpec(INTERACTIVE, KEYS[INTERACTIVE], parse_source(config.interactive),
                             priority=0)
    batch = None if config.batch.strip() == "none" else TenantSpec(
        BATCH, KEYS[BATCH], parse_source(config.batch), priority=2)
    arrivals = plan_arrivals(interactive.source)
    bench = _Bench(config, cached_prompts(folder), folder, interactive, batch,
                   duration_s=arrivals[-1].arrival_s + config.tail_s,
                   tpot_slo_s=None if config.tpot_slo_ms is None else config.tpot_slo_ms / 1000)
    slo_s, slo_source, alone_p90 = None, "not measured: interrupted", None
    try:
        slo_s, slo_source, alone_p90 = _measure_slo(bench)
        for policy in config.policies:
            _slicegate_run(bench, policy, bench.tenants(), slo_s)
        for name, flags in config.sweep:
            _slicegate_run(bench, "slice", bench.tenants(), slo_s, name=name, extra=flags)
        for policy in config.no_cache_runs:
            _slicegate_run(bench, policy, bench.tenants(), slo_s, name=policy + NO_CACHE,
                           extra=("--no-prefix-cache",))
        for peer in config.peers:
            _peer_run(bench, peer, slo_s)
    except KeyboardInterrupt:
        bench.interrupted = True
    times = {"command": command or f"run_bench({config!r})", "started_at": started_at,
             "finished_at": _now()}
    return _write(bench, slo_s, slo_source, alone_p90, arrivals, times)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def cached_prompts(folder: Path) -> PromptFn:
    """Prompt texts of `folder`'s tokenizer, each (tokens, salt) built once: every run
    (and layout, `loadgen/bench_models.py`) replays the same texts."""
    builder = PromptBuilder.from_folder(folder)
    cache: dict[tuple[int, str], str] = {}

    def prompt(num_tokens: int, salt: str) -> str:
        # NOTE: every run replays the same texts, built once.
        key = (num_tokens, salt)
        if key not in cache:
            cache[key] = builder.text(num_tokens, salt)
        return cache[key]

    return prompt


def _measure_slo(bench: _Bench) -> tuple[float | None, str, float | None]:
    """(SLO, where it came from, the alone run's interactive p90 TTFT); the alone run also
    sets a TPOT SLO given as a factor."""
    config = bench.config
    fixed_s = None if config.slo_ms is None else config.slo_ms / 1000
    source = ("given (--slo-ms)" if config.slo_ms != recipe_defaults(config.recipe).slo_ms
              else f"the {config.recipe} recipe's")
    if not config.needs_alone_run:
        return fixed_s, source, None
    outcome = _slicegate_run(bench, config.alone_policy, (bench.interactive,), fixed_s,
                             name=config.alone_run)
    p90 = outcome.summary.get("hp_ttft_p90_s") if outcome.ok else None
    tpot = outcome.summary.get("hp_tpot_p50_s") if outcome.ok else None
    if config.tpot_slo_factor is not None and tpot is not None:
        bench.tpot_slo_s = config.tpot_slo_factor * tpot
    if fixed_s is not None:
        if p90 is not None:
            _judge_alone(outcome, fixed_s)
        return fixed_s, source, p90
    if p90 is None:
        return None, f"not measured: {config.alone_run} failed ({outcome.reason})", None
    factor = "" if config.slo_factor == 1 else f"{config.slo_factor:g} x "
    slo_s = config.slo_factor * p90
    _judge_alone(outcome, slo_s)
    return (slo_s, f"{factor}p90 TTFT of {INTERACTIVE} alone under {config.alone_policy}", p90)


def _judge_alone(outcome: RunOutcome, slo_s: float) -> None:
    """The alone run's own attainment of the SLO it set: how much a mixed run can reach."""
    if outcome.result is not None:
        records = [r for r in outcome.result.records if r.tenant == INTERACTIVE]
        outcome.summary["hp_slo_attainment"] = slo_attainment(records, slo_s)[0]


def write_tenants_file(path: Path, slo_s: float | None, tpot_slo_s: float | None = None,
                       models: dict[str, str] | None = None) -> Path:
    """The slicegate tenants YAML: interactive (high, with the SLOs), batch (low), an admin
    key; ``models`` gives tenants their ``default_model`` (tenant name -> model name)."""
    interactive: dict[str, Any] = {"name": INTERACTIVE, "api_keys": [KEYS[INTERACTIVE]],
                                   "priority": "high"}
    if slo_s is not None:
        interactive["ttft_slo_ms"] = max(1, round(slo_s * 1000))
    if tpot_slo_s is not None:
        interactive["tpot_slo_ms"] = max(1, round(tpot_slo_s * 1000))
    batch: dict[str, Any] = {"name": BATCH, "api_keys": [KEYS[BATCH]], "priority": "low"}
    for tenant in (interactive, batch):
        if models and tenant["name"] in models:
            tenant["default_model"] = models[tenant["name"]]
    doc = {"admin_keys": [ADMIN_KEY], "tenants": [interactive, batch]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _slicegate_run(bench: _Bench, policy: str, tenants: tuple[TenantSpec, ...],
                   slo_s: float | None, name: str | None = None,
                   extra: tuple[str, ...] = ()) -> RunOutcome:
    config, name = bench.config, name or policy
    # NOTE: each run its own data dir (Batch API files, tenant store): a server elsewhere on
    # the machine holds the default one's lock.
    run_dir = config.out / "runs" / name
    port = free_port()
    command = slicegate_command(
        config.serve_cmd, model=config.model, policy=policy,
        tenants=write_tenants_file(run_dir / "tenants.yaml", slo_s, bench.tpot_slo_s), port=port,
        devices=config.devices, dtype=config.dtype, max_model_len=config.max_model_len,
        extra=("--data-dir", str(run_dir / "data"), *config.serve_args, *extra))
    spec = ServerSpec(name, command, port, "/health", None, config.ready_timeout_s)
    return _run(bench, spec, tenants, slo_s, ADMIN_KEY, note="")


def _peer_run(bench: _Bench, peer: str, slo_s: float | None) -> RunOutcome:
    config = bench.config
    spec = peer_spec(peer, bench.folder, free_port(), config.peers_dir,
                     config.peer_ready_timeout_s)
    script = Path(spec.command[1])
    if not script.is_file():
        return _record(bench, RunOutcome.failed(peer, f"peer script {script} not found"))
    note = "" if (config.dtype, config.max_model_len) == ("bfloat16", 2048) else (
        "peer serves bfloat16, max model len 2048 (its script's settings)")
    return _run(bench, spec, bench.tenants(), slo_s, "", note=note)


def _run(bench: _Bench, spec: ServerSpec, tenants: tuple[TenantSpec, ...],
         slo_s: float | None, admin_key: str, note: str) -> RunOutcome:
    run_dir = bench.config.out / "runs" / spec.name
    mixed = len(tenants) > 1
    # NOTE: the SLO is the interactive tenant's only; every server is held to it.
    tenants = tuple(replace(t, slo_s=slo_s) if t.name == INTERACTIVE else t for t in tenants)
    replay_config = ReplayConfig(
        url=spec.url, tenants=tenants, model=spec.model,
        duration_s=bench.duration_s if mixed else None,
        drain_timeout_s=bench.config.drain_timeout_s,
        request_timeout_s=bench.config.request_timeout_s, admin_key=admin_key,
        dialect=spec.dialect, warmup_requests=bench.config.warmup_requests,
        handle_signals=True)
    print(f"bench: {spec.name}: starting {shlex.join(spec.command)}", flush=True)
    try:
        with RunningServer(spec, run_dir / "server.log") as server:
            server.wait_ready()
            print(f"bench: {spec.name}: ready, replaying", flush=True)
            result = asyncio.run(replay(replay_config, bench.prompt))
    except (ServerError, RuntimeError, OSError) as exc:
        return _record(bench, RunOutcome.failed(spec.name, str(exc), note))
    report = write_report(result, run_dir)
    write_plots(result, run_dir, {INTERACTIVE: slo_s})
    if result.interrupted:
        note = "; ".join(filter(None, [note, "interrupted: partial run"]))
    outcome = _record(bench, RunOutcome(spec.name, summarize_run(report, INTERACTIVE, BATCH),
                                        note=note, result=result,
                                        report_path=run_dir / "report.md"))
    if result.interrupted:
        raise KeyboardInterrupt
    return outcome


def _record(bench: _Bench, outcome: RunOutcome) -> RunOutcome:
    bench.outcomes[outcome.name] = outcome
    status = "ok" if outcome.ok else f"FAILED: {outcome.reason}"
    print(f"bench: {outcome.name}: {status}", flush=True)
    return outcome


def _write(bench: _Bench, slo_s: float | None, slo_source: str, alone_p90: float | None,
           arrivals: list[TraceRequest], times: dict[str, str]) -> dict[str, Any]:
    config = bench.config
    doc = {
        **times,
        "config": {k: (str(v) if isinstance(v, Path) else v)
                   for k, v in asdict(config).items()},
        "model_folder": str(bench.folder),
        "interactive_requests": len(arrivals),
        "mixed_duration_s": bench.duration_s,
        "slo_s": slo_s,
        "slo_source": slo_source,
        "alone_run": config.alone_run,
        "alone_hp_ttft_p90_s": alone_p90,
        "tpot_slo_s": bench.tpot_slo_s,
        "interrupted": bench.interrupted,
        "runs": {name: o.to_json() for name, o in bench.outcomes.items()},
    }
    runs = [*config.policies, *(n for n, _ in config.sweep),
            *(p + NO_CACHE for p in config.no_cache_runs)]
    section: list[str] = []
    if recipe_defaults(config.recipe).ratios_to == PEER:
        saturating = saturating_summary(
            bench.outcomes, [config.alone_run, *runs, *config.peers], config.alone_run)
        doc["saturating"] = saturating
        section = saturating_lines(saturating, slo_s)
    section += sweep_lines(config.sweep)
    (config.out / "bench.json").write_text(json.dumps(doc, indent=2) + "\n")
    markdown = format_bench_markdown(doc, bench.outcomes, runs, config.peers, section)
    (config.out / "bench.md").write_text(markdown)
    write_bench_plots(bench.outcomes, config.out, slo_s, INTERACTIVE)
    return doc
