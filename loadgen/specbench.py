"""`python -m loadgen spec-bench`: speculative decoding side by side, one request at a time.

1. slicegate starts once, with `--speculative-config SPEC` server-wide. Each prompt of
   each workload (`loadgen.codeedit`: code-edit, chat) is sent twice per repeat, greedy
   and streamed: with the body field `speculative: false` ("off") and without it ("on").
   The two alternate in order from one repeat to the next, so both see the same machine.
2. Each peer (vLLM's CPU build, `loadgen/peers/vllm-cpu.sh`) starts with the same
   `--speculative-config` and gets the same requests. A peer that does not start is
   recorded with the end of its log (the evidence), and the run goes on.

Per request: TPOT = (last token's time - first token's) / (tokens - 1) and output tok/s =
tokens / (last token's time - send time). The table gives medians (TPOT p50 and
median tok/s) per server, mode and workload, and the on/off TPOT ratio.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from loadgen.codeedit import Prompt, workload
from loadgen.servers import PEERS_DIR, RunningServer, ServerError, ServerSpec, free_port

DEFAULT_SPEC = ('{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, '
                '"prompt_lookup_min": 2}')


@dataclass(frozen=True, slots=True)
class SpecBenchConfig:
    """What one spec-bench run does (see the module docstring)."""

    out: Path
    model: str = "default"  # slicegate's --model
    peer_model_dir: str | None = None  # the model folder peers serve; None: no peers
    peers: tuple[str, ...] = ("vllm",)
    spec: str = DEFAULT_SPEC  # the --speculative-config JSON, for slicegate and peers
    workloads: tuple[str, ...] = ("code-edit", "chat")
    requests: int = 6  # prompts per workload
    repeats: int = 3
    max_tokens: int = 128
    devices: str = "cpu:0"
    dtype: str = "bfloat16"
    serve_args: tuple[str, ...] = ()
    ready_timeout_s: float = 900.0
    peer_ready_timeout_s: float = 1800.0

    def __post_init__(self) -> None:
        json.loads(self.spec)  # NOTE: a typo fails here, not after minutes of start-up
        if self.requests < 1 or self.repeats < 1 or self.max_tokens < 2:
            raise ValueError("requests and repeats must be >= 1, max_tokens >= 2")


@dataclass(slots=True)
class Sample:
    """One streamed request's timings (monotonic seconds from its send)."""

    server: str
    mode: str  # "on" / "off"
    workload: str
    prompt: str
    repeat: int
    tokens: int = 0
    first_s: float | None = None
    last_s: float | None = None
    error: str | None = None
    text: str = field(default="", repr=False)

    @property
    def tpot_s(self) -> float | None:
        if self.first_s is None or self.last_s is None or self.tokens < 2:
            return None
        return (self.last_s - self.first_s) / (self.tokens - 1)

    @property
    def tok_per_s(self) -> float | None:
        return None if not self.last_s or not self.tokens else self.tokens / self.last_s


async def _one(client: httpx.AsyncClient, model: str, prompt: Prompt, max_tokens: int,
               extra: dict[str, Any], sample: Sample) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": prompt.content}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, **extra}
    t0 = time.monotonic()
    pieces: list[str] = []
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            sample.error = f"HTTP {r.status_code}: {(await r.aread())[:300]!r}"
            return
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                sample.tokens = int(chunk["usage"]["completion_tokens"])
            for c in chunk.get("choices") or ():
                if (c.get("delta") or {}).get("content"):
                    now = time.monotonic() - t0
                    sample.first_s = sample.first_s if sample.first_s is not None else now
                    sample.last_s = now
                    pieces.append(c["delta"]["content"])
    sample.text = "".join(pieces)


async def drive(client: httpx.AsyncClient, model: str, server: str,
                modes: dict[str, dict[str, Any]], cfg: SpecBenchConfig) -> list[Sample]:
    """Every prompt of every workload, once per mode (mode -> extra body fields) and
    repeat, one at a time, after a warm-up request; modes alternate in order per repeat."""
    prompts = {w: workload(w, cfg.requests) for w in cfg.workloads}
    out: list[Sample] = []
    warm = Sample(server, "warm-up", "chat", "warm-up", -1)
    await _one(client, model, Prompt("warm-up", "Say hi."), 8, {}, warm)
    for rep in range(cfg.repeats):
        order = list(modes) if rep % 2 == 0 else list(reversed(modes))
        for w, ps in prompts.items():
            for p in ps:
                for mode in order:
                    s = Sample(server, mode, w, p.name, rep)
                    await _one(client, model, p, cfg.max_tokens, modes[mode], s)
                    out.append(s)
    return out


async def _drive(url: str, model: str, server: str, modes: dict[str, dict[str, Any]],
                 cfg: SpecBenchConfig) -> list[Sample]:
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        return await drive(client, model, server, modes, cfg)


def _serve(cfg: SpecBenchConfig, port: int) -> ServerSpec:
    cmd = (sys.executable, "-m", "gateway", "serve", "--model", cfg.model, "--devices",
           cfg.devices, "--dtype", cfg.dtype, "--host", "127.0.0.1", "--port", str(port),
           "--speculative-config", cfg.spec, *cfg.serve_args)
    return ServerSpec("slicegate", cmd, port, "/health", None, cfg.ready_timeout_s)


def _peer(cfg: SpecBenchConfig, peer: str, port: int) -> ServerSpec:
    if peer != "vllm" or cfg.peer_model_dir is None:
        raise ValueError(f"unknown peer {peer!r} (known: vllm, with --peer-model-dir)")
    cmd = ("bash", str(PEERS_DIR / "vllm-cpu.sh"), cfg.peer_model_dir, str(port),
           "--speculative-config", cfg.spec)
    return ServerSpec("vllm", cmd, port, "/health", "peer", cfg.peer_ready_timeout_s)


def _run_server(spec: ServerSpec, cfg: SpecBenchConfig, modes: dict[str, dict[str, Any]],
                runs: dict[str, Any]) -> list[Sample]:
    log = cfg.out / "logs" / f"{spec.name}.log"
    with RunningServer(spec, log) as server:
        try:
            server.wait_ready()
        except ServerError as exc:
            runs[spec.name] = {"status": "failed", "error": str(exc)}
            return []
        model = spec.model or httpx.get(f"{spec.url}/v1/models").json()["data"][0]["id"]
        samples = asyncio.run(_drive(spec.url, model, spec.name, modes, cfg))
        runs[spec.name] = {"status": "ok", "command": list(spec.command)}
        return samples


def summarize(samples: list[Sample]) -> list[dict[str, Any]]:
    """One row per (server, mode, workload): medians of the per-request figures."""
    keys = sorted({(s.server, s.mode, s.workload) for s in samples})
    rows: list[dict[str, Any]] = []
    for server, mode, w in keys:
        group = [s for s in samples if (s.server, s.mode, s.workload) == (server, mode, w)]
        tpots = [t for s in group if (t := s.tpot_s) is not None]
        rates = [v for s in group if (v := s.tok_per_s) is not None]
        rows.append({"server": server, "mode": mode, "workload": w, "requests": len(group),
                     "errors": sum(s.error is not None for s in group),
                     "tokens_p50": statistics.median([s.tokens for s in group]),
                     "tpot_p50_ms": 1e3 * statistics.median(tpots) if tpots else None,
                     "tok_per_s_p50": statistics.median(rates) if rates else None})
    base = {(row["server"], row["workload"]): row["tpot_p50_ms"] for row in rows
            if row["mode"] == "off"}
    for row in rows:
        off = base.get((row["server"], row["workload"]))
        on = row["tpot_p50_ms"]
        row["tpot_vs_off"] = on / off if isinstance(on, float) and off else None
    return rows


def markdown(rows: list[dict[str, Any]], runs: dict[str, Any]) -> str:
    def f(v: Any, digits: int = 2) -> str:
        return "-" if v is None else f"{v:.{digits}f}" if isinstance(v, float) else str(v)
    lines = ["| server | speculation | workload | requests | tokens p50 | TPOT p50 ms | "
             "output tok/s p50 | TPOT vs off |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['server']} | {r['mode']} | {r['workload']} | {r['requests']} | "
              f"{f(r['tokens_p50'], 0)} | {f(r['tpot_p50_ms'])} | {f(r['tok_per_s_p50'], 1)} | "
              f"{f(r['tpot_vs_off'])} |" for r in rows]
    failed = {k: v for k, v in runs.items() if v.get("status") != "ok"}
    for name, run in failed.items():
        lines.append(f"\n{name} did not run: {run.get('error', '')[-800:]}")
    return "\n".join(lines) + "\n"


def run_spec_bench(cfg: SpecBenchConfig, command: str) -> dict[str, Any]:
    """Run the bench; writes spec-bench.json and spec-bench.md under `cfg.out`."""
    cfg.out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, Any] = {}
    samples = _run_server(_serve(cfg, free_port()), cfg,
                          {"off": {"speculative": False}, "on": {}}, runs)
    for peer in cfg.peers if cfg.peer_model_dir else ():
        samples += _run_server(_peer(cfg, peer, free_port()), cfg, {"on": {}}, runs)
    rows = summarize(samples)
    doc = {"command": command, "cpu": _cpu(), "config": {**asdict(cfg), "out": str(cfg.out)},
           "runs": runs, "rows": rows,
           "samples": [{**asdict(s), "tpot_s": s.tpot_s, "tok_per_s": s.tok_per_s}
                       for s in samples]}
    (cfg.out / "spec-bench.json").write_text(json.dumps(doc, indent=1))
    (cfg.out / "spec-bench.md").write_text(markdown(rows, runs))
    return doc


def _cpu() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return "unknown"
    return next((ln.split(":", 1)[1].strip() for ln in out.splitlines()
                 if ln.startswith("Model name")), "unknown")
