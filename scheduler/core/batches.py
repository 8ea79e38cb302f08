"""The batches a plan's compute ops read: one `BatchSource` per chunk and device, built
from its requests' tokens, block tables and sampling state when the plan is issued."""

from __future__ import annotations

from executors.types import Device
from models.batch import BatchSource, SeqSpec, TokenHistory
from scheduler.core.state import RequestState
from scheduler.round.plan import Feed, Plan


def attach_batches(plan: Plan, states: dict[str, RequestState], block_size: int,
                   devices: dict[str, Device]) -> None:
    """Give every compute op its device's `BatchSource` (one per chunk and device)."""
    for chunk, ops in zip(plan.chunks, plan.chunk_ops, strict=True):
        sources: dict[str, BatchSource] = {}
        for op in ops:
            if op.device not in sources:
                sources[op.device] = BatchSource(seqs(chunk, op.device, states, block_size),
                                                 block_size, devices[op.device].torch_device)
            op.batch = sources[op.device]


def seqs(chunk: list[Feed], device: str, states: dict[str, RequestState],
         block_size: int) -> list[SeqSpec]:
    """The chunk's sequences as `device` runs them (ValueError for a feed past the KV)."""
    out = []
    for f in chunk:
        s = states[f.rid]
        table = s.tables[device]
        tokens, num_draft = s.fed_ids(f.past, f.num_tokens)
        if f.past + f.num_tokens > min(s.num_tokens + num_draft, len(table) * block_size):
            raise ValueError(f"{f.rid}: feed [{f.past}, +{f.num_tokens}) is out of range")
        history = TokenHistory.of(s.req.sampling, s.req.prompt_token_ids,
                                  s.output_ids) if f.samples else None
        out.append(SeqSpec(f.rid, tokens, f.past, list(table),
                           sample=f.samples, sampling=s.req.sampling,
                           num_generated=len(s.output_ids), history=history,
                           constraint=s.req.constraint if f.samples else None,
                           prompt_targets=s.prompt_targets(f.past, f.num_tokens),
                           adapter=s.req.adapter, num_draft=num_draft))
    return out
