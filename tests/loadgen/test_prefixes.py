"""Trace prefixes: hash_ids to prompt content, the theoretical hit rate, /metrics counters."""

from __future__ import annotations

from loadgen.prefixes import (
    block_tokens,
    counter_delta,
    parse_prefix_counters,
    prompt_from_blocks,
    theoretical_hit_rate,
)
from loadgen.traces import TraceRequest
from loadgen.workload import ClosedLoop, parse_source


def _words(n: int, salt: str) -> str:
    """A fake PromptFn: `n` one-word tokens, all of them depending on the salt."""
    return "".join(f"{salt}.{i} " for i in range(n))


def test_equal_ids_give_equal_blocks_and_different_ids_differ():
    cache: dict[tuple[int, int], str] = {}
    a = prompt_from_blocks(_words, 10, (1, 2, 3), 4, cache)
    b = prompt_from_blocks(_words, 12, (1, 2, 5), 4, cache)
    assert len(a.split()) == 10 and len(b.split()) == 12
    assert a.split()[:8] == b.split()[:8] and a.split()[8] != b.split()[8]
    assert prompt_from_blocks(_words, 4, (9,), 4, cache).split()[0] != a.split()[0]
    # a partial last block is content of its own, not a prefix of the full block
    assert prompt_from_blocks(_words, 6, (1, 2), 4, cache).split()[4] == "block-2-2.0"


def test_theoretical_hit_rate_counts_leading_full_blocks_seen_before():
    reqs = [TraceRequest(0.0, 10, 1, (1, 2, 3)),  # nothing seen: 0 of 10
            TraceRequest(1.0, 12, 1, (1, 2, 4)),  # blocks 1, 2 seen: 8 of 12
            TraceRequest(2.0, 8, 1, (1, 2)),  # both seen, but its last token is computed: 7
            TraceRequest(3.0, 8, 1, (7, 1))]  # a miss first: nothing after it counts
    assert theoretical_hit_rate(reqs, 4) == (0 + 8 + 7 + 0) / (10 + 12 + 8 + 8)
    assert theoretical_hit_rate([], 4) is None


def test_block_tokens_scale_with_the_trace():
    assert block_tokens(parse_source("mooncake.jsonl")) == 512
    assert block_tokens(parse_source("mooncake.jsonl,token_scale=0.125")) == 64
    assert block_tokens(parse_source("m.jsonl,token_scale=0.5,prompt_scale=0.25")) == 64
    assert block_tokens(ClosedLoop(2, 10, 10)) is None


def test_counters_per_tenant_and_without_tenants():
    slicegate = (
        '# TYPE vllm:prefix_cache_queries counter\n'
        'vllm:prefix_cache_queries_total{model_name="m",priority="high",tenant="ide"} 100.0\n'
        'vllm:prefix_cache_queries_total{model_name="m",priority="low",tenant="ide"} 50.0\n'
        'vllm:prefix_cache_hits_total{model_name="m",priority="high",tenant="ide"} 60.0\n'
        'vllm:prefix_cache_queries_created{model_name="m",priority="high",tenant="ide"} 1.7e9\n')
    assert parse_prefix_counters(slicegate) == {"ide": (150.0, 60.0)}
    vllm = ('vllm:prefix_cache_queries_total{engine="0",model_name="m"} 40.0\n'
            'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 10.0\n')
    assert parse_prefix_counters(vllm) == {"*": (40.0, 10.0)}
    assert counter_delta({"*": (10.0, 5.0)}, {"*": (40.0, 10.0)}) == {"*": (30.0, 5.0)}
