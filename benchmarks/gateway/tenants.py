"""`python -m benchmarks.gateway tenants`: how soon a key added through the admin API works
while streams are in flight, on a real server, and what budget accounting costs a request.

One server (`python -m gateway serve`, the default model, a tenants file with tenants
`load` and `probe`) runs `--streams` streamed completions of tenant `load` through the
official `openai` client. Once every stream has its first token, each round adds a key to
`probe` (`POST /admin/tenants/probe/keys`, the server makes it) and times (a) the admin call,
(b) until `GET /v1/models` with the new key answers 200 (the key is accepted) and (c) until
a streamed completion with it has its first token; then it revokes the key and checks that
it gets 401 at once. Every stream must end with all its tokens. Then, apart from the server:
a request's budget accounting (plan, hold, settle with its SQLite commit) on a database file,
median of `--accounting` runs. Medians of the rounds.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import openai

from benchmarks.harness import machine, machine_line, parser, print_table, write_json
from gateway.tenancy.budget import Budget
from gateway.tenancy.keys import hash_key, key_id
from gateway.tenancy.ledger import BudgetLedger
from gateway.tenancy.store import TenantStore
from gateway.tenants import Tenant
from loadgen.servers import RunningServer, ServerSpec, default_serve_cmd, free_port

TENANTS = """\
admin_keys: [sk-bench-admin]
tenants:
  - {name: load, api_keys: [sk-bench-load], priority: low}
  - {name: probe, api_keys: [sk-bench-probe], priority: high,
     budget: {daily_tokens: 100000000}}
"""
ADMIN = {"authorization": "Bearer sk-bench-admin"}


async def _stream(client: openai.AsyncOpenAI, model: str, tokens: int,
                  started: asyncio.Event) -> int:
    stream = await client.completions.create(
        model=model, prompt="Write a long story about a lighthouse.", stream=True,
        max_tokens=tokens, extra_body={"min_tokens": tokens, "ignore_eos": True},
        stream_options={"include_usage": True})
    used = 0
    async for chunk in stream:
        started.set()
        if chunk.usage is not None:
            used = chunk.usage.completion_tokens
    return used


async def _probe_round(url: str, model: str) -> dict[str, float]:
    """Add a key, time until it works, revoke it and check it is refused."""
    async with httpx.AsyncClient(base_url=url, headers=ADMIN, timeout=60) as admin:
        t0 = time.perf_counter()
        made = (await admin.post("/admin/tenants/probe/keys", json={})).json()
        added = time.perf_counter()
        key = made["api_key"]
        headers = {"authorization": f"Bearer {key}"}
        models = await admin.get("/v1/models", headers=headers)
        assert models.status_code == 200, models.text
        accepted = time.perf_counter()
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
        stream = await client.completions.create(model=model, prompt="Hi", max_tokens=2,
                                                 stream=True)
        first = None
        async for _ in stream:
            first = first or time.perf_counter()
        await client.close()
        revoked = await admin.delete(f"/admin/tenants/probe/keys/{key_id(hash_key(key))}")
        refused = await admin.get("/v1/models", headers=headers)
        assert revoked.status_code == 200 and refused.status_code == 401, refused.text
    assert first is not None
    return {"admin_call_s": added - t0, "key_accepted_s": accepted - t0,
            "first_token_s": first - t0}


async def _run(url: str, streams: int, tokens: int, rounds: int) -> dict[str, list[float]]:
    load = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-bench-load", max_retries=0)
    model = (await load.models.list()).data[0].id
    events = [asyncio.Event() for _ in range(streams)]
    tasks = [asyncio.create_task(_stream(load, model, tokens, e)) for e in events]
    await asyncio.gather(*(e.wait() for e in events))
    out: dict[str, list[float]] = {"admin_call_s": [], "key_accepted_s": [],
                                   "first_token_s": [], "streams_in_flight": []}
    for _ in range(rounds):
        out["streams_in_flight"].append(sum(not t.done() for t in tasks))
        for name, value in (await _probe_round(url, model)).items():
            out[name].append(value)
    used = await asyncio.gather(*tasks)
    await load.close()
    assert used == [tokens] * streams, f"streams ended short: {used}"
    return out


def accounting_s(runs: int) -> list[float]:
    """Seconds of one request's budget accounting (plan, hold, settle and its commit)."""
    tenant = Tenant("t", budget=Budget(daily_tokens=10**12))
    with tempfile.TemporaryDirectory() as folder:
        store = TenantStore(Path(folder) / "slicegate.db")
        ledger = BudgetLedger()
        ledger.attach(store)
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            [cap] = ledger.plan(tenant, 100, [64])
            ledger.hold(tenant, 100, cap).settle(100, 64)
            times.append(time.perf_counter() - t0)
        store.close()
    return times


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser("python -m benchmarks.gateway tenants", __doc__)
    p.add_argument("--model", default="default", help="the served model (default: default)")
    p.add_argument("--streams", type=int, default=50, help="streams in flight")
    p.add_argument("--tokens", type=int, default=64, help="output tokens per stream")
    p.add_argument("--rounds", type=int, default=5, help="keys added, one after another")
    p.add_argument("--accounting", type=int, default=2000, help="budget accounting runs")
    p.add_argument("--log", type=Path, default=Path("bench-results/tenants-server.log"))
    args = p.parse_args(argv)
    for name in ("httpx", "httpx2"):
        logging.getLogger(name).setLevel(logging.WARNING)
    print(machine_line())
    tenants = args.log.parent / "bench-tenants.yaml"
    tenants.parent.mkdir(parents=True, exist_ok=True)
    tenants.write_text(TENANTS)
    port = free_port()
    with tempfile.TemporaryDirectory() as data_dir:
        spec = ServerSpec("slicegate", (*default_serve_cmd(), "--model", args.model, "--host",
                                        "127.0.0.1", "--port", str(port), "--tenants",
                                        str(tenants), "--data-dir", data_dir), port)
        with RunningServer(spec, args.log) as server:
            server.wait_ready()
            times = asyncio.run(_run(spec.url, args.streams, args.tokens, args.rounds))
    times["accounting_s"] = accounting_s(args.accounting)
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    rows = [(name, f"{medians[name] * 1e3:.2f}",
             " ".join(f"{t * 1e3:.1f}" for t in times[name]) if name != "accounting_s"
             else f"{len(times[name])} runs") for name in times if name != "streams_in_flight"]
    print(f"streams in flight at each round: {times['streams_in_flight']}")
    print_table(("measure", "median (ms)", "runs (ms)"), "lrr", rows)
    result = {**machine(), "model": args.model, "streams": args.streams,
              "tokens": args.tokens, "rounds": args.rounds, "times_s": times,
              "median_s": medians}
    write_json(args.json, result)
    return result
