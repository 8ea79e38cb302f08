"""The chaos scenarios (see loadgen/chaos.py): each returns its `Row` with its goal judged."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from loadgen import chaos_probe as probe
from loadgen.chaos import ADMIN_KEY, BATCH, INTERACTIVE, Chaos, ChaosConfig, PromptFn, Server
from loadgen.chaos_report import Row, classify, markdown, slo_attainment
from loadgen.client import RequestRecord
from loadgen.drops import drop_streams
from loadgen.fuzz import run_schemathesis
from loadgen.probe import first_model


def _per_tenant(records: list[RequestRecord]) -> dict[str, dict[str, int]]:
    out: dict[str, Counter[str]] = {}
    for r in records:
        c = out.setdefault(r.tenant, Counter())
        c["sent"] += 1
        c["completed"] += r.ok
        c["output_tokens"] += r.output_tokens if r.ok else 0
    return {t: dict(c) for t, c in sorted(out.items())}


async def overload(ch: Chaos) -> Row:
    c = ch.cfg
    cap = await ch.measure_capacity()
    rates = {INTERACTIVE[0]: 0.1 * cap, INTERACTIVE[1]: 0.1 * cap,
             BATCH[0]: (c.overload_factor - 0.7) * cap, BATCH[1]: 0.5 * cap}

    async def body(server: Server, row: Row) -> None:
        result = await ch.run_load(server, ch.tenants(rates, c.overload_s))
        row.outcomes = classify(result.records)
        chat = [r for r in result.records if r.tenant in INTERACTIVE]
        row.interactive_slo, row.interactive_admitted = slo_attainment(chat, c.slo_ms / 1000)
        row.details.update(capacity_rps=round(cap, 3), offered_rps=round(sum(rates.values()), 3),
                           per_tenant=_per_tenant(result.records),
                           interactive_ttft_s=sorted(round(r.ttft_s, 3) for r in chat
                                                     if r.ttft_s is not None))

    goal = (f">= 99% of admitted interactive within {c.slo_ms:.0f} ms SLO; refusals 429/503 + "
            "Retry-After; 0 5xx; 0 lost")
    row = await ch.with_server("overload", body, goal, *ch.queue_flags(cap))
    o = row.outcomes
    row.met = ((row.interactive_slo or 0.0) >= 0.99 and o.shed_without_retry_after == 0
               and o.server_5xx == 0 and o.lost == 0 and o.failed == 0 and row.healthy)
    return row


async def faults(ch: Chaos) -> Row:
    c = ch.cfg
    cap = await ch.measure_capacity()
    rate = 0.5 * cap
    rates = {INTERACTIVE[0]: rate / 4, BATCH[1]: 3 * rate / 4}

    async def body(server: Server, row: Row) -> None:
        result = await ch.run_load(server, ch.tenants(rates, c.fault_requests / rate))
        row.outcomes = classify(result.records)
        row.details["fault_rate"] = c.fault_rate

    goal = f"{100 * c.fault_rate:g}% ops fail: every request completes or ends with a clear error"
    row = await ch.with_server("faults", body, goal, "--fault-rate", str(c.fault_rate))
    row.met = row.outcomes.lost == 0 and row.kv_blocks_after == 0 and row.healthy
    return row


async def drops(ch: Chaos) -> Row:
    c = ch.cfg

    async def body(server: Server, row: Row) -> None:
        model = await first_model(server.client, "sk-batch-b")
        keys = [f"sk-{t}" for t in (*INTERACTIVE, *BATCH)]
        stats = await drop_streams(server.url, model, keys, c.drops, 32,
                                   ch.prompt(c.prompt_tokens, "drops"), 4 * c.output_tokens,
                                   c.seed)
        row.outcomes.sent = stats.sent
        row.outcomes.completed = stats.finished_first
        row.outcomes.shed.update(stats.refused)
        row.outcomes.errors.update(stats.errors)
        row.details["dropped"] = dict(stats.dropped)

    row = await ch.with_server("drops", body, f"{c.drops} streams dropped: 0 KV blocks leaked")
    row.met = row.kv_blocks_after == 0 and row.healthy
    return row


async def fuzz(ch: Chaos) -> Row:
    c = ch.cfg

    async def body(server: Server, row: Row) -> None:
        doc = (await server.client.get("/openapi.json")).json()
        ops = sum(len(v) for v in doc["paths"].values())
        per_op = max(1, math.ceil(c.fuzz_cases / ops))
        result = await asyncio.to_thread(run_schemathesis, server.url, per_op, c.seed + 1,
                                         c.out / "fuzz", 3 * 3600.0, 1,
                                         ("Authorization: Bearer sk-batch-b",))
        row.outcomes.sent = result.cases
        row.outcomes.server_5xx = result.server_errors
        row.details.update({k: v for k, v in result.to_json().items() if k != "output_tail"})
        row.details["max_examples_per_operation"] = per_op

    row = await ch.with_server("fuzz", body, f"{c.fuzz_cases} schemathesis cases: 0 server "
                                             "errors, 0 schema violations")
    d = row.details
    row.met = (d.get("server_errors") == 0 and d.get("schema_violations") == 0
               and d.get("exit_code") == 0 and row.healthy)
    return row


async def soak(ch: Chaos) -> Row:
    c = ch.cfg
    cap = await ch.measure_capacity()
    load = c.soak_load * cap
    rates = {INTERACTIVE[0]: 0.15 * load, INTERACTIVE[1]: 0.15 * load, BATCH[1]: 0.7 * load}
    samples: list[tuple[float, int]] = []

    async def sample(server: Server, t0: float) -> None:
        while True:
            rss = await probe.rss_bytes(server.client)
            if rss is not None:
                samples.append((time.monotonic() - t0, rss))
            await asyncio.sleep(max(1.0, c.soak_s / 60))

    async def body(server: Server, row: Row) -> None:
        task = asyncio.ensure_future(sample(server, time.monotonic()))
        try:
            result = await ch.run_load(server, ch.tenants(rates, c.soak_s))
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        row.outcomes = classify(result.records)
        chat = [r for r in result.records if r.tenant in INTERACTIVE]
        row.interactive_slo, row.interactive_admitted = slo_attainment(chat, c.slo_ms / 1000)
        row.details["rss_mib_by_s"] = [(round(t), round(rss / 2**20)) for t, rss in samples]
        warm = [rss for t, rss in samples if t >= 0.2 * c.soak_s]
        if len(warm) >= 2:
            row.details["rss_after_warmup_mib"] = round(warm[0] / 2**20, 1)
            row.details["rss_growth_after_warmup"] = round(warm[-1] / warm[0] - 1, 4)
        row.details.update(load_rps=round(load, 3), rss_samples=len(samples))

    row = await ch.with_server("soak", body, f"{c.soak_s / 60:g} min at "
                                             f"{100 * c.soak_load:.0f}% load: RSS growth < 5% "
                                             "after warm-up")
    growth = row.details.get("rss_growth_after_warmup")
    row.met = (growth is not None and growth < 0.05 and row.outcomes.lost == 0
               and row.kv_blocks_after == 0 and row.healthy)
    return row


RUNNERS: dict[str, Callable[[Chaos], Awaitable[Row]]] = {
    "overload": overload, "faults": faults, "drops": drops, "fuzz": fuzz, "soak": soak}


def machine_line() -> str:
    """The CPU capability line (`models.cpu`, in a subprocess: loadgen imports no server)."""
    done = subprocess.run([sys.executable, "-c", "from models.cpu import cpu_caps; "
                           "print(cpu_caps().line())"], capture_output=True, text=True,
                          check=False, timeout=120)
    return done.stdout.strip() or "unknown"


async def run_chaos(cfg: ChaosConfig, prompt: PromptFn) -> list[Row]:
    ch = Chaos(cfg, prompt)
    rows = []
    for name in cfg.scenarios:
        rows.append(await RUNNERS[name](ch))
        write(cfg, rows, "")
    return rows


def write(cfg: ChaosConfig, rows: list[Row], command: str) -> dict[str, Any]:
    """chaos.json and chaos.md in `cfg.out`; returns the JSON document."""
    doc = {"command": command, "machine": machine_line() if command else None,
           "config": {k: str(v) if isinstance(v, Path) else v
                      for k, v in asdict(cfg).items()},
           "admin_key": ADMIN_KEY, "rows": [r.to_json() for r in rows],
           "all_met": all(r.met for r in rows)}
    (cfg.out / "chaos.json").write_text(json.dumps(doc, indent=2, default=str))
    (cfg.out / "chaos.md").write_text(markdown(rows) + "\n")
    return doc
