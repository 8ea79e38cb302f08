"""``python -m loadgen probe --overhead``: what the serving path adds to one request, at idle.

The same requests are timed two ways in one run, interleaved round by round:

- **directly**: ``python -m models direct`` (its own process, no server) runs
  the operator chain on each prompt: batch building, the operators, greedy
  sampling, one step per output token;
- **through slicegate** over HTTP, one request at a time on an otherwise
  idle server: text prompts (so tokenization is on the path), an API key
  (auth), ``/v1/completions`` non-streaming (JSON) and streaming (SSE).

Each request through slicegate is also paired with its chain timed **in the
server**: ``POST /admin/direct`` runs the same prompt and ``max_tokens``
straight through the operators on the device's executor thread (the thread
that runs the request's ops), right before or after the request, alternately.
The *paired overhead* (the goal's figure) is the median of the per-request
differences: both sides meet the same process, thread and moment of the
machine, where ``direct``'s own process meets another moment (on a noisy VM
the chain's time moves by 10-30% within minutes). The overhead against
``direct`` (server time - direct time, medians) stays beside it.

The server's op timeline
(``/admin/timeline``) splits each server request into: *before the first
op* (HTTP in, auth, tokenization, submission, the scheduling round, the
hand-off to the executor thread), *ops* (the operators themselves), *between
ops* (hand-offs and the scheduling rounds of later steps) and *after the
last op* (the token's way back to the event loop, detokenization, JSON or
SSE, HTTP out).

The timed requests go over one keep-alive HTTP/1.1 connection of
``loadgen.leanhttp`` (httpx reads the model and the op timeline), so the
overhead holds no client library's Python. Each server round also times
``GET /health`` round trips through httpx and through that connection,
alternately: the summary's ``client`` says what httpx would have added per
request. Nothing is subtracted from the overhead.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import yaml

from loadgen.client import CompletionCall
from loadgen.direct import run_models_direct
from loadgen.leanhttp import LeanConnection
from loadgen.probe import TimelinePoller, first_model
from loadgen.prompts import PromptBuilder, resolve_model_folder
from loadgen.quiet import Profiling, profiling, until_quiet, wait_quiet
from loadgen.servers import RunningServer, ServerSpec, default_serve_cmd, free_port
from loadgen.stats import median_interval
from loadgen.timed_requests import RoundTrips, time_completion, time_health
from loadgen.timeline import OpSpan

API_KEY, ADMIN_KEY = "sk-probe-1", "sk-probe-admin"
MODES = ("json", "stream")
GOAL_MS = 5.0  # per-request overhead at idle, each mode
MAX_REDONE = 50  # pairs timed again in a round (a background profile ran): then kept


@dataclass(frozen=True, slots=True)
class ProbeConfig:
    """What the probe runs. Counts are requests per (case, mode) per round."""

    out: Path
    model: str = "default"
    dtype: str = "bfloat16"
    devices: str = "cpu:0"  # NOTE: one device, so the server runs the same chain as `direct`
    prompt_tokens: tuple[int, ...] = (16, 128)
    max_tokens: tuple[int, ...] = (1, 16)
    requests: int = 20
    rounds: int = 2
    warmup: int = 3
    serve_cmd: tuple[str, ...] = field(default_factory=default_serve_cmd)
    ready_timeout_s: float = 600.0
    python: str = sys.executable
    # intra-op threads of the server's CPU devices (`--cpu-threads`) and of `direct`; None:
    # the server's default (the cores split between its CPU devices)
    threads: int | None = None
    health_round_trips: int = 30  # GET /health per client (httpx, lean) per round

    def cases(self) -> list[tuple[int, int]]:
        return [(n, k) for n in self.prompt_tokens for k in self.max_tokens]

    def direct_threads(self) -> int:
        """The threads each of the server's CPU executors runs on, unless given.

        NOTE: the server's rule (scheduler.execution.cpu_threads), restated because
        loadgen reaches the server over HTTP only: the cores split between CPU devices.
        """
        if self.threads is not None:
            return self.threads
        cpus = sum(d.strip().startswith("cpu") for d in self.devices.split(","))
        return max(1, (os.cpu_count() or 1) // max(1, cpus))


@dataclass(slots=True)
class Sample:
    """One request through the server; times on this process's monotonic clock."""

    case: tuple[int, int]
    mode: str
    send_s: float
    first_s: float | None  # first token (streaming only)
    end_s: float
    spans: list[OpSpan] = field(default_factory=list)
    # the same request's chain timed in the server (/admin/direct): (first token, total) s
    paired: tuple[float, float] | None = None

    def paired_ms(self) -> tuple[float | None, float | None]:
        """(TTFT, total) minus the paired chain's, ms (TTFT only when streamed)."""
        if self.paired is None:
            return None, None
        ttft = (None if self.first_s is None
                else (self.first_s - self.send_s - self.paired[0]) * 1e3)
        return ttft, (self.end_s - self.send_s - self.paired[1]) * 1e3

    def split_ms(self) -> dict[str, float | None]:
        """before first op / ops (and the executor threads' CPU time in them, None where the
        server does not say) / between ops / after last op, and the three together (the path
        outside the ops), ms (empty without spans)."""
        if not self.spans:
            return {}
        start, end = min(s.start_s for s in self.spans), max(s.end_s for s in self.spans)
        ops = sum(s.end_s - s.start_s for s in self.spans)
        cpu = [s.cpu_s for s in self.spans if s.cpu_s is not None]
        return {"before_first_op": (start - self.send_s) * 1e3, "ops": ops * 1e3,
                "ops_cpu": sum(cpu) * 1e3 if len(cpu) == len(self.spans) else None,
                "between_ops": (end - start - ops) * 1e3,
                "after_last_op": (self.end_s - end) * 1e3,
                "outside_ops": (self.end_s - self.send_s - ops) * 1e3}


def _tenants(path: Path) -> Path:
    doc = {"admin_keys": [ADMIN_KEY],
           "tenants": [{"name": "probe", "api_keys": [API_KEY], "priority": "high"}]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def server_command(config: ProbeConfig, port: int) -> tuple[str, ...]:
    """The probed server's command line (its tenants file is written on the way)."""
    return (*config.serve_cmd, "--model", config.model, "--dtype", config.dtype,
            "--devices", config.devices, "--tenants", str(_tenants(config.out / "tenants.yaml")),
            "--host", "127.0.0.1", "--port", str(port),
            # NOTE: `direct` recomputes every prompt; so must the server (no prefix cache)
            "--no-prefix-cache",
            *(() if config.threads is None else ("--cpu-threads", str(config.threads))))


def _server(config: ProbeConfig) -> RunningServer:
    port = free_port()
    return RunningServer(ServerSpec("slicegate", server_command(config, port), port, "/health",
                                    None, config.ready_timeout_s), config.out / "server.log")


def run_direct(config: ProbeConfig, prompts: list[tuple[tuple[int, int], str]]) -> list[dict]:
    """`python -m models direct` over the prompts, each timed once after a warm-up."""
    return run_models_direct(config.python, config.model, config.dtype, config.direct_threads(),
                             1, [{"prompt": p, "max_tokens": c[1], "case": c}
                                 for c, p in prompts], config.out / "direct-cases.json")


async def _one(lean: LeanConnection, model: str, case: tuple[int, int], mode: str,
               prompt: str) -> Sample:
    call = CompletionCall(model, prompt, case[1], API_KEY)
    t = await time_completion(lean, call, stream=mode == "stream")
    return Sample(case, mode, t.send_s, t.first_s, t.end_s)


async def _in_server_chain(client: httpx.AsyncClient, model: str, case: tuple[int, int],
                          prompt: str) -> tuple[float, float]:
    """The request's chain timed on the server's executor thread: (first token, total) s."""
    r = await client.post("/admin/direct", headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                          json={"model": model, "prompt": prompt, "max_tokens": case[1]})
    r.raise_for_status()
    body = r.json()
    return float(body["first_token_s"]), float(body["total_s"])


async def _paired(lean: LeanConnection, client: httpx.AsyncClient, poller: TimelinePoller,
                  model: str, case: tuple[int, int], mode: str, prompt: str,
                  chain_first: bool) -> Sample:
    """One request and its chain timed in the server, in the order `chain_first` says."""
    chain = await _in_server_chain(client, model, case, prompt) if chain_first else None
    sample = await _one(lean, model, case, mode, prompt)
    await poller.poll_once()
    if chain is None:
        chain = await _in_server_chain(client, model, case, prompt)
    sample.paired = chain
    return sample


async def _server_round(config: ProbeConfig, url: str, prompts: list[tuple[tuple[int, int], str]]
                        ) -> tuple[list[Sample], RoundTrips, int]:
    """The round's samples, its `GET /health` round trips, and how many pairs were timed
    again because a background profile ran during them."""
    samples: list[Sample] = []
    redone = 0
    address = httpx.URL(url)
    async with (httpx.AsyncClient(base_url=url, timeout=300.0) as client,
                LeanConnection(address.host, address.port or 80) as lean):
        model = await first_model(client, API_KEY)
        # NOTE: the server runs on this host (`_server`): one clock, no offset to estimate
        poller = TimelinePoller(client, ADMIN_KEY, time.monotonic(), same_clock=True)
        state = await until_quiet(client)
        for mode in MODES:
            for i, (case, prompt) in enumerate(prompts):
                pair = partial(_paired, lean, client, poller, model, case, mode, prompt,
                               chain_first=i % 2 == 1)
                sample, state, again = await _clear_of_profiles(client, pair, state,
                                                                MAX_REDONE - redone)
                samples.append(sample)
                redone += again
        trips = await time_health(client, lean, config.health_round_trips)
    for s in samples:
        s.spans = [p for p in poller.spans if s.send_s <= p.start_s and p.end_s <= s.end_s]
    return samples, trips, redone


async def _clear_of_profiles(client: httpx.AsyncClient, pair: Callable[[], Awaitable[Sample]],
                             state: Profiling, most: int) -> tuple[Sample, Profiling, int]:
    """`pair` timed (again, up to `most` more times) until no background profile ran during
    it; `state` is what `/metrics` said before, with none running. -> the sample, what
    `/metrics` says after it, and how many times it was timed again."""
    again = 0
    while True:
        sample = await pair()
        before, state = state, await profiling(client)
        if not _profiled_during(before, state) or again >= most:
            return sample, state, again
        again += 1
        state = await until_quiet(client)


def _profiled_during(before: Profiling, after: Profiling) -> bool:
    """Whether a background profile ran between two reads of `/metrics` (`before` read
    while none ran): one runs now, or one more has ended."""
    return after.running or after.done != before.done


def _prompts(builder: PromptBuilder, config: ProbeConfig, round_: int,
             count: int) -> list[tuple[tuple[int, int], str]]:
    return [(case, builder.text(case[0], f"probe-{round_}-{case}-{i}"))
            for case in config.cases() for i in range(count)]


def run_probe(config: ProbeConfig) -> dict[str, Any]:
    """Start the server, interleave direct and server rounds (each once the server runs no
    background profile), return the summary."""
    config.out.mkdir(parents=True, exist_ok=True)
    builder = PromptBuilder.from_folder(resolve_model_folder(config.model, config.python))
    direct: list[dict] = []
    samples: list[Sample] = []
    trips = RoundTrips()
    waited: list[float] = []
    with _server(config) as server:
        server.wait_ready()
        asyncio.run(_server_round(config, server.spec.url,
                                  _prompts(builder, config, -1, config.warmup)))
        redone = 0
        for r in range(config.rounds):
            prompts = _prompts(builder, config, r, config.requests)
            waited.append(wait_quiet(server.spec.url))
            direct += run_direct(config, prompts)
            waited.append(wait_quiet(server.spec.url))
            round_samples, round_trips, round_redone = asyncio.run(
                _server_round(config, server.spec.url, prompts))
            samples += round_samples
            redone += round_redone
            trips.extend(round_trips)
    return {**summarize(config, direct, samples, trips), "quiet_waits_s": waited,
            "pairs_redone": redone}


def _med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def summarize(config: ProbeConfig, direct: list[dict], samples: list[Sample],
              trips: RoundTrips | None = None) -> dict[str, Any]:
    """Per (case, mode): direct and server medians (ms), overheads, the server-side split;
    and what httpx adds to a round trip (``client``, None without ``trips``)."""
    rows = []
    for case in config.cases():
        d = [x for x in direct if tuple(x["case"]) == case]
        d_ttft = _med([x["ttft_s"][0] * 1e3 for x in d])
        d_total = _med([x["total_s"][0] * 1e3 for x in d])
        for mode in MODES:
            ss = [s for s in samples if s.case == case and s.mode == mode]
            total = _med([(s.end_s - s.send_s) * 1e3 for s in ss])
            ttft = _med([(s.first_s - s.send_s) * 1e3 for s in ss if s.first_s is not None])
            splits = [s.split_ms() for s in ss if s.spans]
            pairs = [s.paired_ms() for s in ss]
            rows.append({
                "prompt_tokens": case[0], "max_tokens": case[1], "mode": mode,
                "requests": len(ss), "direct_ttft_ms": d_ttft, "direct_total_ms": d_total,
                "server_ttft_ms": ttft, "server_total_ms": total,
                "ttft_overhead_ms": None if ttft is None or d_ttft is None else ttft - d_ttft,
                "overhead_ms": None if total is None or d_total is None else total - d_total,
                "paired_direct_total_ms": _med([s.paired[1] * 1e3 for s in ss
                                                if s.paired is not None]),
                "paired_ttft_overhead_ms": _med([t for t, _ in pairs if t is not None]),
                "paired_overhead_ms": _med([t for _, t in pairs if t is not None]),
                "paired_overhead_ci_ms": median_interval([t for _, t in pairs if t is not None]),
                "split_ms": {k: _med([v for sp in splits if (v := sp[k]) is not None]) for k in
                             ("before_first_op", "ops", "ops_cpu", "between_ops",
                              "after_last_op", "outside_ops")}})
    conf = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()}
    return {"config": conf, "rows": rows, "goal": _goal(rows), "client": _client(trips)}


def _client(trips: RoundTrips | None) -> dict[str, Any] | None:
    if trips is None or not trips.httpx_s or not trips.lean_s:
        return None
    httpx_ms = statistics.median(trips.httpx_s) * 1e3
    lean_ms = statistics.median(trips.lean_s) * 1e3
    return {"round_trips": len(trips.lean_s), "httpx_ms": httpx_ms, "lean_ms": lean_ms,
            "httpx_extra_ms": httpx_ms - lean_ms}


def _goal(rows: list[dict]) -> dict[str, Any]:
    """Judged on the medians; `clear_misses` counts the rows whose median's 95% interval
    lies wholly above the goal (a miss that the pairs' spread cannot explain)."""
    ones = [r for r in rows if r["max_tokens"] == 1]
    paired = [r["paired_overhead_ms"] for r in ones]
    worst = None if not ones or None in paired else max(paired)
    clear = [r for r in ones if (ci := r.get("paired_overhead_ci_ms")) and ci[0] > GOAL_MS]
    return {"what": f"paired overhead <= {GOAL_MS} ms per request (max_tokens 1, each mode)",
            "worst_ms": worst, "met": worst is not None and worst <= GOAL_MS,
            "clear_misses": len(clear)}


def _fmt_ci(ci: tuple[float, float] | list[float] | None) -> str:
    return "–" if not ci else f"{ci[0]:.1f} – {ci[1]:.1f}"


def _fmt(v: float | None) -> str:
    return "–" if v is None else f"{v:.1f}"


def markdown(summary: dict[str, Any]) -> str:
    lines = ["| prompt | max_tokens | mode | direct TTFT ms | server TTFT ms | direct total ms "
             "| server total ms | overhead ms | in-server chain ms | paired overhead ms "
             "| its 95% interval | before 1st op | ops | ops' CPU | between ops | after last op "
             "| outside ops |",
             "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in summary["rows"]:
        sp = r["split_ms"]
        lines.append(
            f"| {r['prompt_tokens']} | {r['max_tokens']} | {r['mode']} | "
            f"{_fmt(r['direct_ttft_ms'])} | {_fmt(r['server_ttft_ms'])} | "
            f"{_fmt(r['direct_total_ms'])} | {_fmt(r['server_total_ms'])} | "
            f"{_fmt(r['overhead_ms'])} | {_fmt(r['paired_direct_total_ms'])} | "
            f"{_fmt(r['paired_overhead_ms'])} | {_fmt_ci(r.get('paired_overhead_ci_ms'))} | "
            f"{_fmt(sp['before_first_op'])} | "
            f"{_fmt(sp['ops'])} | {_fmt(sp['ops_cpu'])} | {_fmt(sp['between_ops'])} | "
            f"{_fmt(sp['after_last_op'])} | {_fmt(sp['outside_ops'])} |")
    g = summary["goal"]
    lines.append(f"\ngoal: {g['what']}: worst {_fmt(g['worst_ms'])} ms, "
                 f"{'met' if g['met'] else 'MISSED'}; rows whose 95% interval lies above the "
                 f"goal: {g.get('clear_misses', '–')}")
    if "pairs_redone" in summary:
        lines.append(f"pairs timed again (a background profile ran during them): "
                     f"{summary['pairs_redone']}")
    c = summary.get("client")
    if c is not None:
        lines.append(f"client: GET /health round trip {c['lean_ms']:.2f} ms lean, "
                     f"{c['httpx_ms']:.2f} ms httpx (httpx adds {c['httpx_extra_ms']:.2f} ms; "
                     "not in the overhead above)")
    return "\n".join(lines)
