"""Streams the client drops at random points: before the response, or after k chunks.

Each stream is a `/v1/completions` request with `stream: true`; the client closes the
connection at its drop point, which the server must see as a disconnect and answer by
aborting the request and freeing its KV blocks.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from dataclasses import dataclass, field

import httpx

from loadgen.client import CompletionCall


@dataclass(slots=True)
class DropStats:
    sent: int = 0
    dropped: Counter[str] = field(default_factory=Counter)  # where: before_response / chunk_k
    finished_first: int = 0  # the stream ended before its drop point
    refused: Counter[str] = field(default_factory=Counter)  # HTTP status -> count (shed)
    errors: Counter[str] = field(default_factory=Counter)  # transport errors -> count


async def _one(client: httpx.AsyncClient, call: CompletionCall, rng: random.Random,
               stats: DropStats) -> None:
    stats.sent += 1
    before_response = rng.random() < 0.2
    after_chunks = rng.randrange(0, call.max_tokens + 1)
    try:
        if before_response:
            send = asyncio.ensure_future(client.post("/v1/completions", json=call.body(),
                                                     headers=call.headers()))
            await asyncio.sleep(rng.uniform(0.0, 0.05))
            if not send.done():
                send.cancel()
                await asyncio.gather(send, return_exceptions=True)
                stats.dropped["before_response"] += 1
                return
            stats.finished_first += 1
            return
        async with client.stream("POST", "/v1/completions", json=call.body(),
                                 headers=call.headers()) as response:
            if response.status_code != 200:
                stats.refused[str(response.status_code)] += 1
                return
            seen = 0
            async for line in response.aiter_lines():
                if line.startswith("data:"):
                    if seen >= after_chunks:
                        stats.dropped[f"after_{min(seen, 9)}+_chunks"] += 1
                        return  # NOTE: leaving the block closes the connection mid-stream
                    seen += 1
            stats.finished_first += 1
    except httpx.HTTPError as exc:
        stats.errors[type(exc).__name__] += 1


async def drop_streams(url: str, model: str, api_keys: list[str], num_streams: int,
                       concurrency: int, prompt: str, max_tokens: int, seed: int = 0
                       ) -> DropStats:
    """Send `num_streams` streams, `concurrency` at a time, each dropped at a random point."""
    rng, stats = random.Random(seed), DropStats()
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=0)
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=120.0, limits=limits) as client:
        async def run(i: int) -> None:
            async with gate:
                call = CompletionCall(model, f"{prompt} #{i}", max_tokens,
                                      api_keys[i % len(api_keys)])
                await _one(client, call, rng, stats)
        await asyncio.gather(*(run(i) for i in range(num_streams)))
    return stats
