"""`python -m benchmarks.gateway small-devices`: chats without `max_tokens` on a device budget
too small for the model's context.

One real server (`python -m gateway serve --device-memory-gib 0.6` on the default model,
two virtual CPU devices) gets `--chats` chat completions at once from the official `openai`
client, none with `max_tokens` (a system prompt asks for one short sentence; greedy). While
they run, `/metrics` is sampled every 50 ms for `vllm:num_requests_running` (requests holding
KV, all tenants and classes). Afterwards `/admin/gmg` gives the KV blocks still in use. The
table gives the context the server started with (`/v1/models` `max_model_len`), whether its
log named the cap, how many chats completed, the most running at once, the wall time and
the preemptions (`vllm:num_preemptions_total`).
"""

from __future__ import annotations

import asyncio
import logging
import re
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import openai

from benchmarks.harness import machine, machine_line, parser, print_table, write_json
from loadgen.servers import RunningServer, ServerSpec, default_serve_cmd, free_port

SYSTEM = "Answer in one short sentence."
QUESTIONS = ("What is the capital of France?", "Name a primary colour.",
             "How many legs does a cat have?", "What is two plus two?")
CAP_LINE = "context capped to"  # gateway/context.py's start-up warning
_RUNNING = re.compile(r"^vllm:num_requests_running\{[^}]*\} (\S+)$", re.M)
_PREEMPTED = re.compile(r"^vllm:num_preemptions_total\{[^}]*\} (\S+)$", re.M)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one run of the bench measured."""

    max_model_len: int  # /v1/models
    cap_logged: bool  # the start-up log named the cap
    chats: int
    completed: int  # answered 200 with a finish_reason of "stop" or "length"
    errors: int
    peak_running: int  # most requests holding KV at once (sampled /metrics)
    wall_s: float
    completion_tokens: int
    preemptions: int
    kv_blocks_used_after: int  # every device's, /admin/gmg, once all ended


def _total(pattern: re.Pattern[str], text: str) -> float:
    return sum(float(v) for v in pattern.findall(text))


async def _sample(http: httpx.AsyncClient, stop: asyncio.Event, seen: list[float]) -> None:
    while not stop.is_set():
        seen.append(_total(_RUNNING, (await http.get("/metrics")).text))
        await asyncio.sleep(0.05)


async def _chat(client: openai.AsyncOpenAI, question: str) -> tuple[bool, int]:
    try:
        r = await client.chat.completions.create(
            model="default", temperature=0,
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}])
    except openai.APIError:
        return False, 0
    ok = r.choices[0].finish_reason in ("stop", "length")
    return ok, r.usage.completion_tokens if r.usage else 0


async def drive(url: str, chats: int) -> dict[str, Any]:
    """Send `chats` chats at once to the server at `url`; the counts of `Outcome` it reads."""
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0,
                                timeout=300)
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        context = (await http.get("/v1/models")).json()["data"][0]["max_model_len"]
        stop, seen = asyncio.Event(), [0.0]
        sampler = asyncio.create_task(_sample(http, stop, seen))
        t0 = time.perf_counter()
        results = await asyncio.gather(*(_chat(client, QUESTIONS[i % len(QUESTIONS)])
                                         for i in range(chats)))
        wall_s = time.perf_counter() - t0
        stop.set()
        await sampler
        gmg = (await http.get("/admin/gmg")).json()
        metrics = (await http.get("/metrics")).text
    await client.close()
    completed = sum(ok for ok, _ in results)
    return {"max_model_len": context, "chats": chats, "completed": completed,
            "errors": chats - completed, "peak_running": int(max(seen)), "wall_s": wall_s,
            "completion_tokens": sum(n for _, n in results),
            "preemptions": int(_total(_PREEMPTED, metrics)),
            "kv_blocks_used_after": sum(d["kv_blocks_used"] for d in gmg["devices"])}


def run(model: str, memory_gib: float, chats: int, log_dir: Path) -> Outcome:
    """Start the server, drive it, stop it."""
    port = free_port()
    cmd = (*default_serve_cmd(), "--model", model, "--device-memory-gib", f"{memory_gib:g}",
           "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning")
    log = log_dir / "server.log"
    with RunningServer(ServerSpec("slicegate", cmd, port, ready_timeout_s=600), log) as server:
        server.wait_ready()
        counts = asyncio.run(drive(server.spec.url, chats))
        capped = CAP_LINE in log.read_text(errors="replace")
    return Outcome(cap_logged=capped, **counts)


def main(argv: list[str] | None = None) -> Outcome:
    p = parser("python -m benchmarks.gateway small-devices", __doc__)
    p.add_argument("--model", default="default")
    p.add_argument("--device-memory-gib", type=float, default=0.6)
    p.add_argument("--chats", type=int, default=32)
    a = p.parse_args(argv)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
    print(machine_line())
    with tempfile.TemporaryDirectory() as tmp:
        out = run(a.model, a.device_memory_gib, a.chats, Path(tmp))
    print(f"--device-memory-gib {a.device_memory_gib:g}, model {a.model}, {a.chats} chats "
          "without max_tokens at once")
    print_table(("context", "cap logged", "completed", "peak running", "wall s",
                 "completion tokens", "preemptions", "KV blocks in use after"), "rlrrrrrr",
                [(out.max_model_len, "yes" if out.cap_logged else "no",
                  f"{out.completed}/{out.chats}", out.peak_running, f"{out.wall_s:.1f}",
                  out.completion_tokens, out.preemptions, out.kv_blocks_used_after)])
    write_json(a.json, {**machine(), "config": {"model": a.model,
                                                "device_memory_gib": a.device_memory_gib,
                                                "chats": a.chats}, **asdict(out)})
    return out
