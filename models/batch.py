"""A batch for one operator run: mixed prefill chunks and decode steps, no padding of queries.

Tokens of all sequences are flattened into one row dimension T. Sequences
feeding more than one token (prefill, or a prefill chunk on top of existing
KV) run attention one by one; sequences feeding one token (decode) run
attention together over their context gathered from the paged cache. A verify
step (one known token and drafts, `SeqSpec.num_draft`) runs as decode rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch

from models.kv_cache import blocks_for
from models.sampling_params import SamplingParams

if TYPE_CHECKING:
    from models.lora import LoraRows


@dataclass(frozen=True, slots=True)
class BatchShape:
    """What cost formulas and estimators see of a batch. Counts of tokens."""

    num_tokens: int  # new tokens fed through the model (T)
    num_seqs: int
    num_sampled: int  # rows the head scores: one per sampling sequence, k + 1 per verify
    attn_work: int  # sum over seqs of new_tokens * context_tokens
    num_context_tokens: int  # sum of context lengths (KV read)


@dataclass(frozen=True, slots=True)
class TokenHistory:
    """A request's tokens so far, which its penalties count: its own lists, not copies.

    NOTE: the scheduler appends to `output_ids` between the runs that sample the request,
    never during one; the sampler reads only their first `SeqSpec.num_generated`. Over
    Ray they are pickled with the batch's sequences, once per batch and device.
    """

    prompt_ids: list[int]  # empty when repetition_penalty is off (nothing reads it)
    output_ids: list[int]  # generated tokens

    @classmethod
    def of(cls, sampling: SamplingParams, prompt_ids: list[int],
           output_ids: list[int]) -> TokenHistory | None:
        """What `sampling`'s penalties read; None when it has none."""
        if not (sampling.adjusts_logits and sampling.penalizes):
            return None
        return cls(prompt_ids if sampling.repetition_penalty != 1 else [], output_ids)


class TokenConstraint(Protocol):
    """A request's grammar as the sampler sees it (`models.grammar.Constraint`)."""

    def banned(self) -> torch.Tensor: ...  # [V] bool, True = the next token may not be it


@dataclass(slots=True)
class SeqSpec:
    """One request's part of a batch, as the scheduler describes it."""

    request_id: str
    token_ids: list[int]  # new tokens fed this run
    num_past_tokens: int  # tokens of this request already in the KV cache
    block_table: list[int]  # this device's blocks; covers past + new tokens
    sample: bool = False  # sample a next token after the last new token
    sampling: SamplingParams = field(default_factory=SamplingParams)
    num_generated: int = 0  # tokens generated before this run (min_tokens, seed stream)
    history: TokenHistory | None = None  # set when it samples and `sampling.penalizes`
    constraint: TokenConstraint | None = None  # structured output: its grammar, by reference
    # the prompt tokens after each fed token, whose log-probs the head returns; set while
    # a request that asks for `sampling.prompt_logprobs` feeds its prompt (at most one per row)
    prompt_targets: list[int] | None = None
    adapter: str | None = None  # the LoRA adapter its rows run with; None = the base model
    # speculative decoding: its last `num_draft` fed tokens are drafted, not known; the head
    # scores its last num_draft + 1 rows and emits 1..num_draft + 1 tokens (`models.speculative`)
    num_draft: int = 0

    @property
    def num_scored(self) -> int:
        """Rows of it the head scores: its last num_draft + 1 when it samples, else none."""
        return self.num_draft + 1 if self.sample else 0

    @property
    def num_context_tokens(self) -> int:
        return self.num_past_tokens + len(self.token_ids)


def shape_of(seqs: list[SeqSpec]) -> BatchShape:
    return BatchShape(
        num_tokens=sum(len(s.token_ids) for s in seqs),
        num_seqs=len(seqs),
        num_sampled=sum(s.num_scored for s in seqs),
        attn_work=sum(len(s.token_ids) * s.num_context_tokens for s in seqs),
        num_context_tokens=sum(s.num_context_tokens for s in seqs),
    )


@dataclass(slots=True)
class PrefillSeq:
    """Tensors for one multi-token sequence's attention."""

    rows: slice  # its rows in the flattened batch
    num_past: int
    blocks: torch.Tensor  # [nb] block ids covering the context (past and new tokens)
    mask: torch.Tensor | None  # [n, nb * block_size] bool, True = attend; None when causal


@dataclass(slots=True)
class DecodeGroup:
    """Tensors for the single-token sequences' batched attention."""

    rows: torch.Tensor  # [B] their rows in the flattened batch
    blocks: torch.Tensor  # [B, nb] block tables, padded with block 0
    mask: torch.Tensor  # [1, B, 1, nb * block_size] bool, True = attend
    lens: torch.Tensor  # [B] long, context tokens of each sequence (this step's included)


@dataclass(slots=True)
class Batch:
    """Device tensors for one operator run, built once per (batch, device)."""

    seqs: list[SeqSpec]
    shape: BatchShape
    input_ids: torch.Tensor  # [T] long
    positions: torch.Tensor  # [T] long
    slot_mapping: torch.Tensor  # [T] long, where each new token's K/V is written
    prefills: list[PrefillSeq]
    decode: DecodeGroup | None
    sample_rows: torch.Tensor  # [S] rows whose hidden state the head samples from (a
    # drafted sequence has num_draft + 1 of them, in order)
    wants_logprobs: bool = False  # a sequence asks for log-probs (`models.logprobs`)
    has_adapters: bool = False  # a sequence runs with a LoRA adapter
    lora: LoraRows | None = None  # its adapter rows, resolved by the first layer op run on it

    @property
    def sampled_seqs(self) -> list[SeqSpec]:
        return [s for s in self.seqs if s.sample]

    @property
    def has_drafts(self) -> bool:
        """A sequence verifies drafted tokens (the head returns a `HeadOutput` with runs)."""
        return any(s.num_draft for s in self.seqs if s.sample)

    @property
    def row_invariant(self) -> bool:
        """Decode rows only, some verifying drafts: each row must compute what it would in a
        one-row step (`models.linear`'s invariant calls), so that greedy verification is
        token for token plain decoding, bf16 included."""
        return not self.prefills and self.has_drafts


def _slots(block_table: list[int], start: int, end: int, block_size: int) -> list[int]:
    return [block_table[p // block_size] * block_size + p % block_size for p in range(start, end)]


def _check(seq: SeqSpec, block_size: int) -> None:
    if not seq.token_ids:
        raise ValueError(f"{seq.request_id}: a sequence must feed at least one token")
    if not 0 <= seq.num_draft < len(seq.token_ids) or (seq.num_draft and not seq.sample):
        raise ValueError(f"{seq.request_id}: {seq.num_draft} drafted tokens of "
                         f"{len(seq.token_ids)} fed, sample={seq.sample}")
    if len(seq.block_table) * block_size < seq.num_context_tokens:
        raise ValueError(f"{seq.request_id}: block table holds "
                         f"{len(seq.block_table) * block_size} tokens, needs "
                         f"{seq.num_context_tokens}")


def _row(seq: SeqSpec, i: int) -> SeqSpec:
    """Token i of a verify step as a decode row: its context ends at that token."""
    return SeqSpec(seq.request_id, seq.token_ids[i:i + 1], seq.num_past_tokens + i,
                   seq.block_table)


def _prefill(seq: SeqSpec, rows: slice, block_size: int, device: torch.device) -> PrefillSeq:
    n, past = len(seq.token_ids), seq.num_past_tokens
    nb = blocks_for(n + past, block_size)
    blocks = torch.tensor(seq.block_table[:nb], device=device)
    if past == 0:
        return PrefillSeq(rows, 0, blocks, None)
    # key j is visible to query i (at position past + i) iff j <= past + i
    mask = torch.ones(n, nb * block_size, dtype=torch.bool, device=device).tril(diagonal=past)
    return PrefillSeq(rows, past, blocks, mask)


def _decode_group(seqs: list[SeqSpec], rows: list[int], block_size: int,
                  device: torch.device) -> DecodeGroup:
    nb = max(blocks_for(s.num_context_tokens, block_size) for s in seqs)
    blocks = torch.zeros(len(seqs), nb, dtype=torch.long)
    lens = torch.tensor([s.num_context_tokens for s in seqs])
    for i, s in enumerate(seqs):
        used = blocks_for(s.num_context_tokens, block_size)
        blocks[i, :used] = torch.tensor(s.block_table[:used])
    mask = torch.arange(nb * block_size)[None, :] < lens[:, None]  # [B, nb * block_size]
    return DecodeGroup(torch.tensor(rows, device=device), blocks.to(device),
                       mask[None, :, None, :].to(device), lens.to(device))


def build_batch(seqs: list[SeqSpec], block_size: int, device: torch.device) -> Batch:
    """Lay out `seqs` for one operator run on `device`."""
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    prefills: list[PrefillSeq] = []
    decode_seqs: list[SeqSpec] = []
    decode_rows: list[int] = []
    sample_rows: list[int] = []
    for s in seqs:
        _check(s, block_size)
        start, end = s.num_past_tokens, s.num_context_tokens
        row0 = len(ids)
        ids.extend(s.token_ids)
        positions.extend(range(start, end))
        slots.extend(_slots(s.block_table, start, end, block_size))
        if len(s.token_ids) == 1:
            decode_seqs.append(s)
            decode_rows.append(row0)
        elif s.num_draft:
            # NOTE: a verify step runs as num_draft + 1 decode rows of one sequence, row i over
            # the context up to its own token (each layer writes every row's K/V before its
            # attention): the kernels of plain decode steps, each row computed as in a one-row
            # step (`Batch.row_invariant`), so greedy output is token for token the same
            decode_seqs += [_row(s, i) for i in range(len(s.token_ids))]
            decode_rows += range(row0, row0 + len(s.token_ids))
        else:
            prefills.append(_prefill(s, slice(row0, len(ids)), block_size, device))
        if s.sample:
            sample_rows.extend(range(len(ids) - 1 - s.num_draft, len(ids)))
    decode = _decode_group(decode_seqs, decode_rows, block_size, device) if decode_seqs else None
    return Batch(
        seqs=seqs, shape=shape_of(seqs),
        input_ids=torch.tensor(ids, device=device),
        positions=torch.tensor(positions, device=device),
        slot_mapping=torch.tensor(slots, device=device),
        prefills=prefills, decode=decode,
        sample_rows=torch.tensor(sample_rows, dtype=torch.long, device=device),
        wants_logprobs=any(s.prompt_targets or (s.sample and s.sampling.logprobs is not None)
                           for s in seqs),
        has_adapters=any(s.adapter is not None for s in seqs),
    )


@dataclass(slots=True)
class BatchSource:
    """What one device's batch is built from; `get()` builds its tensors once, on first use.

    NOTE: the scheduler makes these on the event loop (plain lists only); the executor
    that runs the first op of the batch on that device builds the tensors, off the loop.
    Only that device's worker calls `get()`, so it needs no lock.
    """

    seqs: list[SeqSpec]
    block_size: int
    device: torch.device
    _batch: Batch | None = None

    @classmethod
    def of(cls, batch: Batch, block_size: int) -> BatchSource:
        """A source whose tensors are already built."""
        return cls(batch.seqs, block_size, batch.input_ids.device, batch)

    @property
    def built(self) -> Batch | None:
        """The tensors, if `get()` built them already."""
        return self._batch

    def get(self) -> Batch:
        if self._batch is None:
            self._batch = build_batch(self.seqs, self.block_size, self.device)
        return self._batch
