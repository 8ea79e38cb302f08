"""Generation through the operator chain and paged KV, one request or a few (CLI, tests)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from models.batch import Batch, SeqSpec, TokenHistory, build_batch
from models.grammar import Constraint
from models.kv_cache import KVCache, blocks_for
from models.loader import Model
from models.sampling_params import SamplingParams


def run_chain(model: Model, batch: Batch, kv: KVCache,
              device: torch.device | None = None) -> torch.Tensor:
    """All operators in order (their copies on `device`, default the model's own); returns
    the head's output [S]."""
    x: torch.Tensor | None = None
    for op in model.ops if device is None else model.ops_on(device):
        x = op.run(batch, x, kv)
    assert x is not None
    return x


def chain_logits(model: Model, batch: Batch, kv: KVCache) -> torch.Tensor:
    """Logits [S, V] of the sampled rows (for tests and benchmarks)."""
    x: torch.Tensor | None = None
    for op in model.ops[:-1]:
        x = op.run(batch, x, kv)
    head = model.ops[-1]
    assert x is not None and hasattr(head, "logits")
    return head.logits(batch, x)


@dataclass(slots=True)
class Generation:
    token_ids: list[int]
    finish_reason: str  # "stop" | "length"


def _step_seq(rid: str, tokens: list[int], past: int, table: list[int],
              params: SamplingParams, generated: int,
              history: TokenHistory | None = None,
              constraint: Constraint | None = None, adapter: str | None = None) -> SeqSpec:
    return SeqSpec(rid, tokens, past, table, sample=True, sampling=params,
                   num_generated=generated, history=history, constraint=constraint,
                   adapter=adapter)


def generate(model: Model, prompt_ids: list[int], params: SamplingParams,
             block_size: int = 16, constraint: Constraint | None = None,
             adapter: str | None = None) -> Generation:
    """Prefill then decode one token at a time until a stop id, max_tokens, or the end of
    `constraint`'s grammar; with `adapter`, that loaded LoRA adapter's (`model.adapters`)."""
    total = len(prompt_ids) + params.max_tokens
    kv = model.new_kv_cache(blocks_for(total, block_size), block_size)
    table = kv.allocator.allocate(blocks_for(total, block_size))
    out: list[int] = []
    feed, past = list(prompt_ids), 0
    history = TokenHistory.of(params, prompt_ids, out)  # reads `out` as it grows
    try:
        while True:
            seq = _step_seq("r0", feed, past, table, params, len(out), history, constraint,
                            adapter)
            token = int(run_chain(model, build_batch([seq], block_size, model.device), kv)[0])
            past += len(feed)
            out.append(token)
            reason = params.finish(token, len(out))
            if constraint is not None:
                constraint.advance(token)
                if reason is None and constraint.is_complete:
                    reason = "stop"
            if reason is not None:
                return Generation(out, reason)
            feed = [token]
    finally:
        kv.allocator.free(table)


def timed_request(model: Model, prompt_ids: list[int], max_tokens: int,
                  block_size: int = 16, device: torch.device | None = None,
                  adapter: str | None = None) -> tuple[float, float]:
    """(seconds to the first token, seconds to the last) of one greedy request run directly.

    What a server's request costs without the server: per step the batch is
    built and the operator chain run (prefill, then `max_tokens - 1` decode
    steps, each sampling one token; stop tokens ignored), on `device` (default:
    the model's), with LoRA `adapter` (loaded in `model.adapters`; None: the base). KV
    blocks are allocated before the clock starts.
    """
    on = model.device if device is None else device
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    total = len(prompt_ids) + max_tokens
    kv = model.new_kv_cache(blocks_for(total, block_size), block_size, device=on)
    table = kv.allocator.allocate(blocks_for(total, block_size))
    feed, past, out = list(prompt_ids), 0, 0
    t0 = time.perf_counter()
    first = 0.0
    while out < max_tokens:
        seq = _step_seq("r0", feed, past, table, params, out, adapter=adapter)
        token = int(run_chain(model, build_batch([seq], block_size, on), kv, on)[0])
        past += len(feed)
        out += 1
        if out == 1:
            first = time.perf_counter() - t0
        feed = [token]
    return first, time.perf_counter() - t0
