"""A fake model that computes on the scheduler's real KV pools, for tests under KV pressure.

Each layer-group op writes, for every new token, `token + 1` into its layers'
key and value slots, and first checks that every earlier position of the
sequence reads back the token that was fed there; the head samples a token
that is a function of the whole sequence. So a block reused too early, a swap
or a migration that loses KV, or a recompute that feeds other tokens makes an
op fail (and the request end with an error) or the output differ from
`expected_tokens`, which computes the same function without any scheduler. A
feed that starts after a prefix cache hit is checked against the request's
prompt (`prompts`): the cached blocks must hold exactly its tokens.
"""

from __future__ import annotations

import torch

from executors.types import OpInstance, OpRole
from models.batch import SeqSpec
from models.kv_cache import KVCache
from models.template import GraphTemplate, OpKind

VOCAB = 1000


def next_token(seq: list[int]) -> int:
    """The fake model's greedy next token after `seq` (never a stop token)."""
    return (sum((i + 1) * t for i, t in enumerate(seq)) * 7919) % (VOCAB - 10) + 5


def expected_tokens(prompt: list[int], max_tokens: int) -> list[int]:
    seq, out = list(prompt), []
    for _ in range(max_tokens):
        out.append(next_token(seq))
        seq.append(out[-1])
    return out


class KVCheckModel:
    """`run_op` for fake executors; `pools` are the scheduler's KV pools (see module doc)."""

    def __init__(self, template: GraphTemplate, pools: dict[str, KVCache]) -> None:
        self.template, self.pools = template, pools
        self.fed: dict[str, list[int]] = {}  # request id -> every token fed, by position
        self.prompts: dict[str, list[int]] = {}  # request id -> its prompt (set by the test)
        self.mismatches: list[str] = []

    def __call__(self, op: OpInstance) -> torch.Tensor | None:
        if op.role is not OpRole.COMPUTE:
            return None
        assert op.batch is not None
        t = self.template.op(op.template_index)
        seqs = op.batch.seqs
        if t.kind is OpKind.LAYERS:
            for seq in seqs:
                self._feed(seq, self.pools[op.device], t.layers)
            return None
        if t.kind is OpKind.HEAD:
            out = [next_token(self.fed[s.request_id][:s.num_context_tokens])
                   for s in seqs if s.sample]
            return torch.tensor(out, dtype=torch.long)
        return None

    def _feed(self, seq: SeqSpec, pool: KVCache, layers: range) -> None:
        fed = self.fed.setdefault(seq.request_id, [])
        past = seq.num_past_tokens
        if past > len(fed) and past <= len(self.prompts.get(seq.request_id, ())):
            fed[:] = self.prompts[seq.request_id][:past]  # a prefix cache hit: checked below
        if past > len(fed):
            raise RuntimeError(f"{seq.request_id}: feeds at {past} with {len(fed)} fed")
        slots = _slots(seq.block_table, 0, past + len(seq.token_ids), pool.block_size)
        want = torch.tensor(fed[:past], dtype=torch.float32) + 1
        for layer in layers:
            keys = pool.keys[layer][0, :, :, 0].view(-1)  # [blocks * block_size], a view
            vals = pool.values[layer][0, :, :, 0].view(-1)
            if past and not (torch.equal(keys[slots[:past]], want)
                             and torch.equal(vals[slots[:past]], -want)):
                self.mismatches.append(seq.request_id)
                raise RuntimeError(f"{seq.request_id}: layer {layer} lost its KV")
            new = torch.tensor(seq.token_ids, dtype=torch.float32) + 1
            keys[slots[past:]] = new
            vals[slots[past:]] = -new
        fed[past:past + len(seq.token_ids)] = seq.token_ids  # a recompute feeds the same


def _slots(table: list[int], start: int, end: int, block_size: int) -> torch.Tensor:
    return torch.tensor([table[p // block_size] * block_size + p % block_size
                         for p in range(start, end)], dtype=torch.long)
