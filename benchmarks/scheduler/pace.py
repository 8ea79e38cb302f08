"""`python -m benchmarks.scheduler pace`: interactive TPOT under a saturating batch load,
without and with a TPOT SLO (the TPOT guard, scheduler/policies/pace.py); in process, no HTTP.

The interactive stream is the `strict` window of the Azure code trace (`policies`), prompts
scaled and capped at 1024 tokens, every request with a TTFT SLO (`--ttft-slo-ms`); a batch
tenant keeps `--lp-concurrency` requests of 1024 + 64 tokens in flight. The stream runs
alone first: its TPOT p50 times `--tpot-factor` is the TPOT SLO of the loaded runs. Then
the loaded runs without and with that SLO, `--repeats` times, interleaved; medians.
TPOT: a request's mean time per output token after its first.
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field, replace

from benchmarks.harness import parser, print_table, write_json
from benchmarks.scheduler.policies import (
    RECIPES,
    Run,
    Workload,
    _lp_stream,
    _pct,
    _prompt,
    hp_trace,
    repeated,
)
from executors.types import Priority
from loadgen.public_traces import AZURE_CODE, require_trace
from models.loader import Model, load
from models.sampling_params import SamplingParams
from scheduler.api import Request
from scheduler.config import SchedulerConfig
from scheduler.cost.estimators import Estimators
from scheduler.cost.profiling import load_or_profile
from scheduler.factory import build_scheduler, parse_devices
from scheduler.scheduler import Scheduler

PROG = "python -m benchmarks.scheduler pace"


@dataclass(slots=True)
class Stream:
    """Per interactive request: TTFT and mean TPOT (s); token counts of both tenants."""

    ttft_s: list[float] = field(default_factory=list)
    tpot_s: list[float] = field(default_factory=list)
    counts: Run = field(default_factory=Run)


async def _one(sched: Scheduler, req: Request, out: Stream) -> None:
    times = [ev.time async for ev in sched.submit(req) if ev.token_id is not None]
    out.counts.hp_tokens += len(times)
    if times:
        out.ttft_s.append(times[0] - req.arrival_time)
    if len(times) > 1:
        out.tpot_s.append((times[-1] - times[0]) / (len(times) - 1))


async def _stream(sched: Scheduler, w: Workload, ttft_slo: float, tpot_slo: float | None,
                  vocab: int, out: Stream) -> None:
    t0, tasks = time.monotonic(), []
    for i, r in enumerate(hp_trace(w)):
        await asyncio.sleep(max(0.0, t0 + r.arrival_s - time.monotonic()))
        p = SamplingParams(temperature=0, max_tokens=r.output_tokens, min_tokens=r.output_tokens)
        req = Request(f"hp{i}", "interactive", Priority.HIGH, _prompt(r.prompt_tokens, i, vocab),
                      p, ttft_slo_s=ttft_slo, tpot_slo_s=tpot_slo)
        tasks.append(asyncio.create_task(_one(sched, req, out)))
    await asyncio.gather(*tasks)


async def _run(model: Model, est: Estimators, w: Workload, devices: str, mem_gib: float,
               ttft_slo: float, tpot_slo: float | None, with_lp: bool) -> dict[str, float]:
    sched = build_scheduler(model, parse_devices(devices, mem_gib),
                            SchedulerConfig(policy="slice", max_model_len=2048), est)
    await sched.start()
    out, stop = Stream(), asyncio.Event()
    t0 = time.monotonic()
    lp = asyncio.create_task(_lp_stream(sched, w, model.config.vocab_size, out.counts, stop)) \
        if with_lp else None
    await _stream(sched, w, ttft_slo, tpot_slo, model.config.vocab_size, out)
    wall = time.monotonic() - t0
    lp_tokens, hp_tokens = out.counts.lp_tokens, out.counts.hp_tokens
    stop.set()
    await sched.stop(drain=False, timeout_s=5)
    if lp is not None:
        lp.cancel()
    met = sum(t <= ttft_slo for t in out.ttft_s) / max(1, len(out.ttft_s))
    paced = (sum(t <= tpot_slo for t in out.tpot_s) / max(1, len(out.tpot_s))
             if tpot_slo is not None else float("nan"))
    return {"hp_requests": len(out.ttft_s), "ttft_attainment": met,
            "ttft_p50_s": _pct(out.ttft_s, 50), "ttft_p99_s": _pct(out.ttft_s, 99),
            "tpot_p50_s": _pct(out.tpot_s, 50), "tpot_p90_s": _pct(out.tpot_s, 90),
            "tpot_attainment": paced, "lp_tok_s": lp_tokens / wall,
            "total_tok_s": (lp_tokens + hp_tokens) / wall, "wall_s": wall}


def run(model: Model, est: Estimators, w: Workload, devices: str, mem_gib: float,
        ttft_slo: float, tpot_slo: float | None, with_lp: bool) -> dict[str, float]:
    row = asyncio.run(_run(model, est, w, devices, mem_gib, ttft_slo, tpot_slo, with_lp))
    gc.collect()  # NOTE: the scheduler and its executors reference each other
    print(", ".join(f"{k} {v:.4f}" for k, v in row.items()), file=sys.stderr, flush=True)
    return row


def main(argv: list[str] | None = None) -> dict[str, object]:
    p = parser(PROG, __doc__)
    p.add_argument("--model", default="default")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--devices", default="cpu:0,cpu:1")
    p.add_argument("--device-memory-gib", type=float, default=2.0)
    p.add_argument("--hp-requests", type=int, default=40)
    p.add_argument("--rate-scale", type=float, default=0.5,
                   help="arrivals at this fraction of the trace's rate")
    p.add_argument("--lp-concurrency", type=int, default=8)
    p.add_argument("--ttft-slo-ms", type=float, default=500.0)
    p.add_argument("--tpot-factor", type=float, default=2.0,
                   help="the TPOT SLO: this times the stream's TPOT p50 alone")
    p.add_argument("--repeats", type=int, default=2)
    a = p.parse_args(argv)
    if a.repeats < 1:
        p.error("--repeats must be >= 1")
    require_trace(AZURE_CODE, PROG)  # NOTE: before minutes of loading and profiling
    w = replace(RECIPES["strict"], hp_requests=a.hp_requests, rate_scale=a.rate_scale,
                lp_concurrency=a.lp_concurrency, lp_prompt=1024, lp_output=64, max_prompt=1024)
    model = load(a.model, dtype=a.dtype)
    est = load_or_profile(model, parse_devices(a.devices, a.device_memory_gib))
    ttft_slo = a.ttft_slo_ms / 1000
    alone = run(model, est, w, a.devices, a.device_memory_gib, ttft_slo, None, with_lp=False)
    tpot_slo = a.tpot_factor * alone["tpot_p50_s"]
    slos = {"no TPOT SLO": None, f"TPOT SLO {tpot_slo * 1000:.1f} ms": tpot_slo}
    runs = repeated(list(slos), a.repeats,
                    lambda name: run(model, est, w, a.devices, a.device_memory_gib, ttft_slo,
                                     slos[name], with_lp=True))
    rows = {name: {k: statistics.median(r[name][k] for r in runs) for k in runs[0][name]}
            for name in slos}
    rows = {"alone": alone, **rows}
    print(f"TTFT SLO {a.ttft_slo_ms:.0f} ms; TPOT SLO {a.tpot_factor:g} x the TPOT p50 alone "
          f"= {tpot_slo * 1000:.1f} ms; loaded rows: medians of {a.repeats}\n")
    print_table(["run", "TTFT ≤ SLO", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms",
                 "TPOT p90 ms", "TPOT ≤ SLO", "batch tok/s", "total tok/s"], "lrrrrrrrr",
                ([name, f"{r['ttft_attainment']:.1%}", f"{r['ttft_p50_s'] * 1000:.0f}",
                  f"{r['ttft_p99_s'] * 1000:.0f}", f"{r['tpot_p50_s'] * 1000:.1f}",
                  f"{r['tpot_p90_s'] * 1000:.1f}", f"{r['tpot_attainment']:.1%}",
                  f"{r['lp_tok_s']:.1f}", f"{r['total_tok_s']:.1f}"] for name, r in rows.items()))
    result: dict[str, object] = {"tpot_slo_s": tpot_slo, "ttft_slo_s": ttft_slo, "rows": rows,
                                 "repeats": runs, "workload": asdict(w), "model": a.model}
    write_json(a.json, result)
    return result
