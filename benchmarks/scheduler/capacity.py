"""`python -m benchmarks.scheduler capacity`: how many requests run at once in a fixed KV space.

Closed-loop clients send chat requests without `max_tokens` (so a server that
reserves KV for everything a request may ever hold reserves the rest of the
context) and read each stream until its planned output length (16-256 tokens,
seeded), then close it, as a client that stops reading. Each server runs the
same load for the same time over HTTP: slicegate with KV grown on demand,
slicegate with the old rule (`--kv-admission full`), and vLLM's CPU build,
each with the same KV space per device. From `/metrics`, sampled every second:
requests running at once (vLLM's metric name, both servers), preemptions, and
slicegate's swapped bytes and recomputed tokens; from the clients: output
tokens per second. With `--repeats`, every run repeats, interleaved (each repeat
starts one run later), and the table shows medians, with slicegate's tokens/s
over vLLM's taken within each repeat (side by side), then their median. For
slicegate it also reads the op timeline (`/admin/timeline`) over each run's second
half: where the devices' time went (`ops_summary`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import random
import re
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness import machine, machine_line, parser, print_table, write_json
from loadgen.prompts import PromptBuilder, resolve_model_folder
from loadgen.servers import (
    PEERS_DIR,
    RunningServer,
    ServerError,
    ServerSpec,
    default_serve_cmd,
    free_port,
)


@dataclass(slots=True)
class Load:
    clients: int = 64
    duration_s: float = 120.0
    min_prompt: int = 64
    max_prompt: int = 512
    min_output: int = 16
    max_output: int = 256
    seed: int = 0
    warmup_s: float = 0.0  # tokens before this far into the run are not counted


@dataclass(slots=True)
class Tally:
    """What one run measured."""

    output_tokens: int = 0
    requests: int = 0
    errors: int = 0
    running: list[float] = field(default_factory=list)  # sampled requests running at once
    metrics_end: dict[str, float] = field(default_factory=dict)
    ops: dict[str, float] = field(default_factory=dict)  # slicegate: `ops_summary`


def _metric(text: str, name: str) -> float:
    """Sum of every sample of `name` in a Prometheus exposition."""
    pattern = re.compile(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.eE+-]+)$", re.M)
    return sum(float(v) for v in pattern.findall(text))


METRICS = ("vllm:num_requests_running", "vllm:num_preemptions_total",
           "slicegate_kv_swapped_bytes_total", "slicegate_kv_recomputed_tokens_total")


async def _client(http: httpx.AsyncClient, spec: ServerSpec, builder: PromptBuilder,
                  rng: random.Random, load: Load, warm: float, stop: float, tally: Tally,
                  who: int) -> None:
    n = 0
    while time.monotonic() < stop:
        prompt = builder.text(rng.randint(load.min_prompt, load.max_prompt), f"c{who}-{n}")
        want = rng.randint(load.min_output, load.max_output)
        body: dict[str, Any] = {"stream": True, "temperature": 0, "ignore_eos": True,
                                "messages": [{"role": "user", "content": prompt}]}
        if spec.model is not None:
            body["model"] = spec.model
        got = 0
        try:
            async with http.stream("POST", f"{spec.url}/v1/chat/completions",
                                   json=body) as resp:
                if resp.status_code != 200:
                    tally.errors += 1
                    await asyncio.sleep(0.5)
                    continue
                async for line in resp.aiter_lines():
                    if line.startswith("data: {") and '"content"' in line:
                        got += 1
                        now = time.monotonic()
                        tally.output_tokens += now >= warm
                        if got >= want or now >= stop:
                            break  # NOTE: closing the stream aborts the request
        except httpx.HTTPError:
            tally.errors += 1
        tally.requests += 1
        n += 1


async def _sample(http: httpx.AsyncClient, url: str, stop: float, tally: Tally) -> None:
    while time.monotonic() < stop:
        await asyncio.sleep(1.0)
        try:
            text = (await http.get(f"{url}/metrics", timeout=5)).text
        except httpx.HTTPError:
            continue
        tally.running.append(_metric(text, "vllm:num_requests_running"))
        tally.metrics_end = {m: _metric(text, m) for m in METRICS}


async def _drive(spec: ServerSpec, builder: PromptBuilder, load: Load) -> tuple[Tally, float]:
    tally = Tally()
    limits = httpx.Limits(max_connections=load.clients + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as http:
        t0 = time.monotonic()
        warm, stop = t0 + load.warmup_s, t0 + load.warmup_s + load.duration_s
        tasks = [_client(http, spec, builder, random.Random(load.seed * 1000 + i), load, warm,
                         stop, tally, i) for i in range(load.clients)]
        await asyncio.gather(_sample(http, spec.url, stop, tally), *tasks)
        wall = time.monotonic() - warm  # NOTE: output tokens count from the warm-up's end
        if not spec.name.startswith("vllm"):
            tally.ops = await _ops(http, spec.url, load.duration_s / 2)
        return tally, wall


async def _ops(http: httpx.AsyncClient, url: str, window_s: float) -> dict[str, float]:
    """slicegate's op timeline over the run's last `window_s` (past the ramp-up), summed up."""
    try:
        events = (await http.get(f"{url}/admin/timeline", timeout=30)).json()["events"]
    except (httpx.HTTPError, ValueError, KeyError):
        return {}
    return ops_summary(events, window_s)


def ops_summary(events: list[dict[str, Any]], window_s: float) -> dict[str, float]:
    """Where the devices' time went over the last `window_s` of a timeline (compute ops):
    `busy` (ops' wall time over the window, per device, averaged), `cpu_share` (the ops'
    thread CPU time over their wall time: below 1, they waited for a core or the GIL),
    `decode_share` (decode steps' share of the layer groups' time; the rest, prompts, alone
    or with decode rows riding along), `decode_seqs_p50` (sequences in a decode step)."""
    ops = [e for e in events if e.get("role") == "compute"]
    if not ops:
        return {}
    t0 = max(e["end"] for e in ops) - window_s
    ops = [e for e in ops if e["start"] >= t0]
    devices = {e["device"] for e in ops}
    wall = sum(e["end"] - e["start"] for e in ops)
    layers = [e for e in ops if e["op"].startswith("layers")]
    decode = [e for e in layers if e["num_tokens"] == e["num_seqs"]]
    timed = [e for e in ops if e.get("cpu") is not None]
    out = {"busy": wall / (window_s * max(1, len(devices))),
           "decode_share": sum(e["end"] - e["start"] for e in decode)
           / max(1e-9, sum(e["end"] - e["start"] for e in layers)),
           "decode_seqs_p50": statistics.median(e["num_seqs"] for e in decode) if decode else 0}
    if timed:
        out["cpu_share"] = sum(e["cpu"] for e in timed) / max(
            1e-9, sum(e["end"] - e["start"] for e in timed))
    return out


def _row(name: str, tally: Tally, wall_s: float, note: str = "") -> dict[str, Any]:
    m = tally.metrics_end
    running = tally.running[len(tally.running) // 4:] or [0.0]  # past the ramp-up
    return {"run": name, "running_mean": statistics.mean(running), "running_max": max(running),
            "output_tok_s": tally.output_tokens / wall_s, "requests": tally.requests,
            "errors": tally.errors, "preemptions": m.get("vllm:num_preemptions_total", 0.0),
            "swapped_mib": m.get("slicegate_kv_swapped_bytes_total", 0.0) / 2**20,
            "recomputed_tokens": m.get("slicegate_kv_recomputed_tokens_total", 0.0),
            "ops": tally.ops, "note": note}


RUNS = ("slicegate", "slicegate-full", "vllm", "vllm-all-cores", "slicegate-one-device")
DEFAULT_RUNS = RUNS[:3]
# NOTE: by default vLLM's CPU build computes on all cores but one, which it reserves for its
# API server (on 2 cores: one of each); `vllm-all-cores` reserves none, so its OpenMP threads
# take every core, as slicegate's two devices' threads take both. `slicegate-one-device`
# is the converse: one device (`cpu:0`) with both devices' KV space, the other core left to
# the event loop, as vLLM leaves it to its API server.
ALL_CORES = (("VLLM_CPU_NUM_OF_RESERVED_CPU", "0"),)


def _spec(a: argparse.Namespace, folder: Path, name: str, data_dir: Path) -> ServerSpec:
    """The server of run `name`, on a fresh port; slicegate's state in `data_dir`.

    NOTE: a data dir of its own: another slicegate on the machine holding the default
    one's lock would stop the run from starting."""
    gib = a.kv_cache_mib / 1024
    port = free_port()
    if name.startswith("vllm"):
        blocks = vllm_blocks(folder, a.kv_cache_mib * a.vllm_devices * 2**20)
        cmd: tuple[str, ...] = ("bash", str(PEERS_DIR / "vllm-cpu.sh"), str(folder), str(port),
                                "--num-gpu-blocks-override", str(blocks))
        env = (("VLLM_CPU_KVCACHE_SPACE", str(math.ceil(gib * a.vllm_devices))),
               *(ALL_CORES if name == "vllm-all-cores" else ()))
        return ServerSpec(name, cmd, port, "/health", "peer", 1800.0, env=env)
    admission = "full" if name == "slicegate-full" else "on-demand"
    one = ("--devices", "cpu:0") if name == "slicegate-one-device" else ()
    cmd = (*default_serve_cmd(), "--model", a.model, "--dtype", "bfloat16",
           "--max-model-len", "2048", "--port", str(port),
           "--kv-cache-gib", str(gib * (a.vllm_devices if one else 1)), *one,
           "--kv-admission", admission, "--log-level", "warning", "--data-dir", str(data_dir))
    return ServerSpec(name, cmd, port, "/health", None, 600.0)


def schedule(runs: list[str], repeats: int) -> list[tuple[int, str]]:
    """(repeat, run) in the order they run: each repeat starts one run later than the one
    before, so that no run always follows the same one (a warm cache, a hot core)."""
    return [(k, runs[(k + i) % len(runs)]) for k in range(repeats) for i in range(len(runs))]


VLLM_CPU_BLOCK_SIZE = 128  # vLLM's CPU backend's block size for this model's attention


def vllm_blocks(folder: Path, kv_bytes: float) -> int:
    """KV blocks of vLLM's CPU build that fit in `kv_bytes` of bf16 KV.

    `VLLM_CPU_KVCACHE_SPACE` takes whole GiB only, so the bench gives vLLM the
    next whole GiB and caps its pool with `--num-gpu-blocks-override`."""
    hf = json.loads((folder / "config.json").read_text())
    head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    per_token = 2 * hf["num_hidden_layers"] * hf["num_key_value_heads"] * head_dim * 2
    return int(kv_bytes // (VLLM_CPU_BLOCK_SIZE * per_token))


def main(argv: list[str] | None = None) -> dict[str, object]:
    p = parser("python -m benchmarks.scheduler capacity", __doc__)
    p.add_argument("--model", default="default")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--duration", type=float, default=120.0,
                   help="seconds per run, after the warm-up")
    p.add_argument("--warmup", type=float, default=0.0,
                   help="seconds of load before the tokens count (the first prompts' prefills)")
    p.add_argument("--kv-cache-mib", type=float, default=256.0, help="KV space per device")
    p.add_argument("--vllm-devices", type=int, default=2,
                   help="vLLM gets this many devices' KV space (default: as much as slicegate's "
                        "two devices together)")
    p.add_argument("--runs", default=",".join(DEFAULT_RUNS),
                   help=f"comma-separated, of: {', '.join(RUNS)} (vLLM's OpenMP threads on "
                        "every core, none reserved for its API server)")
    p.add_argument("--repeats", type=int, default=1, help="each run this many times, interleaved")
    p.add_argument("--no-peer", dest="peer", action="store_false", help="skip vLLM")
    p.add_argument("--out", type=Path, default=Path("bench-results/capacity"))
    a = p.parse_args(argv)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # NOTE: not a line per request
    runs = [r.strip() for r in a.runs.split(",")
            if r.strip() and (a.peer or not r.strip().startswith("vllm"))]
    if a.clients < 1 or a.duration <= 0 or a.repeats < 1 or a.warmup < 0:
        p.error("--clients and --repeats must be >= 1, --duration > 0 and --warmup >= 0")
    if not runs or set(runs) - set(RUNS) or len(set(runs)) != len(runs):
        p.error(f"--runs: distinct names among {', '.join(RUNS)}")
    folder = resolve_model_folder(a.model)
    builder = PromptBuilder.from_folder(folder)
    load = Load(clients=a.clients, duration_s=a.duration, warmup_s=a.warmup)
    print(machine_line(), file=sys.stderr, flush=True)
    per_repeat: list[dict[str, dict[str, Any]]] = [{} for _ in range(a.repeats)]
    for k, name in schedule(runs, a.repeats):
        print(f"capacity: {name} (repeat {k + 1}): starting", file=sys.stderr, flush=True)
        spec = _spec(a, folder, name, a.out / f"{name}-{k + 1}-data")
        try:
            with RunningServer(spec, a.out / f"{name}-{k + 1}.log") as server:
                server.wait_ready()
                tally, wall = asyncio.run(_drive(spec, builder, load))
            per_repeat[k][name] = _row(name, tally, wall)
        except ServerError as e:
            per_repeat[k][name] = {"run": name, "note": f"did not run: {e}"}
    rows = [medians(name, [rep[name] for rep in per_repeat]) for name in runs]
    _print(rows, per_repeat, a)
    result: dict[str, object] = {"rows": rows, "repeats": per_repeat, "load": asdict(load),
                                 "kv_cache_mib": a.kv_cache_mib,
                                 "vllm_kv_cache_mib": a.kv_cache_mib * a.vllm_devices,
                                 **machine()}
    write_json(a.json, result)
    return result


FIGURES = ("running_mean", "running_max", "output_tok_s", "requests", "errors", "preemptions",
           "swapped_mib", "recomputed_tokens")


def medians(name: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One run's row over its repeats: the median of each figure over the repeats that ran,
    and each repeat's tokens/s (`output_tok_s_repeats`)."""
    ran = [r for r in rows if "output_tok_s" in r]
    if not ran:
        return {"run": name, "note": "; ".join(r["note"] for r in rows)}
    out: dict[str, Any] = {"run": name, **{f: statistics.median(r[f] for r in ran)
                                           for f in FIGURES}}
    out["output_tok_s_repeats"] = [r["output_tok_s"] for r in ran]
    keys = set().union(*(r.get("ops", {}) for r in ran))
    out["ops"] = {k: statistics.median(r["ops"][k] for r in ran if k in r.get("ops", {}))
                  for k in sorted(keys)}
    out["note"] = f"{len(rows) - len(ran)} of {len(rows)} repeats did not run" \
        if len(ran) < len(rows) else ""
    return out


def ratio_to_vllm(per_repeat: list[dict[str, dict[str, Any]]], name: str) -> float | None:
    """Median over the repeats where both ran of `name`'s tokens/s over vLLM's."""
    ratios = [rep[name]["output_tok_s"] / rep["vllm"]["output_tok_s"] for rep in per_repeat
              if "output_tok_s" in rep.get(name, {}) and rep.get("vllm", {}).get("output_tok_s")]
    return statistics.median(ratios) if ratios else None


def _print(rows: list[dict[str, Any]], per_repeat: list[dict[str, dict[str, Any]]],
           a: argparse.Namespace) -> None:
    print(f"KV space {a.kv_cache_mib:g} MiB per device; {a.clients} closed-loop clients; "
          f"{a.duration:g} s per run after {a.warmup:g} s of warm-up; medians of "
          f"{a.repeats} repeat(s), the ratio to vLLM's tokens/s taken within each repeat")
    print_table(["run", "running at once (mean / max)", "output tok/s", "x vLLM", "per repeat",
                 "requests", "preemptions", "swapped MiB", "recomputed tokens", "errors"],
                "lrrrlrrrrr", (_cells(r, ratio_to_vllm(per_repeat, r["run"])) for r in rows))
    for r in rows:
        o = r.get("ops")
        if o:
            print(f"{r['run']}: devices busy {o['busy']:.2f}, ops' CPU over wall time "
                  f"{o.get('cpu_share', float('nan')):.2f}, decode steps "
                  f"{o['decode_share']:.0%} of the layer groups' time at "
                  f"{o['decode_seqs_p50']:g} sequences (p50), over the last "
                  f"{a.duration / 2:g} s (medians)")


def _cells(r: dict[str, Any], ratio: float | None) -> list[object]:
    if "running_mean" not in r:
        return [r["run"], r["note"], *[""] * 8]
    return [r["run"], f"{r['running_mean']:.1f} / {r['running_max']:.0f}",
            f"{r['output_tok_s']:.1f}", "" if ratio is None else f"{ratio:.2f}",
            ", ".join(f"{x:.1f}" for x in r["output_tok_s_repeats"]), f"{r['requests']:.0f}",
            f"{r['preemptions']:.0f}", f"{r['swapped_mib']:.1f}",
            f"{r['recomputed_tokens']:.0f}", f"{r['errors']:.0f}"]
