"""Shared prompt prefixes of a trace: content from ``hash_ids``, and the hit rates to compare.

Mooncake traces give each request the ids of its prompt's 512-token blocks;
equal ids mean equal content (and an equal prefix before it). Replay turns
them into text: each id's block is the prompt text of ``block_tokens`` tokens
salted with the id (built once, reused), so equal ids give equal blocks and
different ids differ from their first token; a partial last block gets its
own content. ``block_tokens`` is 512 scaled like the trace's prompts.

The report compares three hit rates (cached over prompt tokens): the trace's
theoretical one (an unbounded cache of full blocks, in arrival order), the
one the server reported per request (``usage.prompt_tokens_details
.cached_tokens``) and the one its ``/metrics`` counters show
(``vllm:prefix_cache_hits`` over ``vllm:prefix_cache_queries``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from loadgen.traces import TraceRequest
from loadgen.workload import Source, TraceSource

MOONCAKE_BLOCK_TOKENS = 512
_COUNTER_RE = re.compile(r"^vllm:prefix_cache_(queries|hits)_total(?:\{([^}]*)\})?\s+(\S+)$",
                         re.MULTILINE)
_LABEL_RE = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

PromptFn = Callable[[int, str], str]  # as loadgen.replay's


def block_tokens(source: Source) -> int | None:
    """Tokens of one ``hash_ids`` block after the source's scales; None without a trace."""
    if not isinstance(source, TraceSource):
        return None
    options: dict[str, Any] = dict(source.options)
    scale = float(options.get("token_scale", 1.0)) * float(options.get("prompt_scale", 1.0))
    return max(1, round(MOONCAKE_BLOCK_TOKENS * scale))


def prompt_from_blocks(prompt: PromptFn, num_tokens: int, hash_ids: Sequence[int],
                       block: int, cache: dict[tuple[int, int], str]) -> str:
    """Prompt text of ``num_tokens`` tokens made of the blocks ``hash_ids`` name."""
    parts, left = [], num_tokens
    for hid in hash_ids:
        if left <= 0:
            break
        size = min(block, left)
        key = (hid, size) if size == block else (hid, -size)
        if key not in cache:
            cache[key] = prompt(size, f"block-{hid}" if size == block else f"block-{hid}-{size}")
        parts.append(cache[key])
        left -= size
    if left > 0:  # NOTE: fewer ids than the prompt's blocks (a scaled or odd row)
        parts.append(prompt(left, f"tail-{num_tokens}-{len(parts)}-{hash_ids[:1]}"))
    return "".join(parts)


def theoretical_hit_rate(requests: Sequence[TraceRequest], block: int) -> float | None:
    """Prompt tokens an unbounded cache of full blocks would serve, over all prompt tokens.

    In arrival order, a request hits its leading full blocks whose ids came before (at most
    all but its last token: the server computes that one)."""
    seen: set[int] = set()
    hits = total = 0
    for r in sorted(requests, key=lambda r: r.arrival_s):
        full = min(len(r.hash_ids), r.prompt_tokens // block)
        ids = r.hash_ids[:full]
        n = 0
        while n < full and ids[n] in seen:
            n += 1
        hits += min(n * block, r.prompt_tokens - 1)
        total += r.prompt_tokens
        seen.update(ids)
    return hits / total if total else None


def parse_prefix_counters(metrics_text: str) -> dict[str, tuple[float, float]]:
    """Tenant (or "*" where the counters carry no tenant) -> (queries, hits) tokens."""
    out: dict[str, list[float]] = {}
    for kind, labels, value in _COUNTER_RE.findall(metrics_text):
        tenant = dict(_LABEL_RE.findall(labels or "")).get("tenant", "*")
        pair = out.setdefault(tenant, [0.0, 0.0])
        pair[0 if kind == "queries" else 1] += float(value)
    return {t: (q, h) for t, (q, h) in out.items()}


async def prefix_counters(client: httpx.AsyncClient) -> dict[str, tuple[float, float]]:
    """The server's prefix cache counters now ({} where it has none)."""
    try:
        response = await client.get("/metrics", timeout=10)
    except httpx.HTTPError:
        return {}
    return parse_prefix_counters(response.text) if response.status_code == 200 else {}


def counter_delta(before: dict[str, tuple[float, float]],
                  after: dict[str, tuple[float, float]]) -> dict[str, tuple[float, float]]:
    """What the counters gained between two scrapes."""
    return {t: (q - before.get(t, (0.0, 0.0))[0], h - before.get(t, (0.0, 0.0))[1])
            for t, (q, h) in after.items()}
