"""Attention over the paged KV cache: KV writes, prefill and decode attention kernels.

Shapes: T = tokens in the batch, H / Hkv = query / KV heads, d = head dim,
n = a prefill's new tokens, C = context length, B = decode sequences.

Which kernel runs is a measured choice (`models.tuning`): explicit matmuls
beat the CPU's flash kernel on some CPUs for small half-precision prefills,
and lose by 10x on others; a native flash kernel over the paged cache
(`models.native.prefill_attention`) beat aten's 2.3x at 512 tokens on one, and its
bf16 twin on AMX tiles beat it 2.4x on a CPU with AMX.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from models import native
from models.batch import Batch, DecodeGroup
from models.choices import LayerChoice
from models.kv_cache import KVCache


def gather(cache: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    # cache: [Hkv, num_blocks, bs, d]; blocks: [B, nb] -> [Hkv, B, nb * bs, d] contiguous
    # NOTE: index_select of whole blocks; advanced indexing is ~10x slower on CPU.
    hkv, nb, bs, d = cache.shape
    rows = cache.view(hkv, nb, bs * d).index_select(1, blocks.flatten())
    return rows.view(hkv, blocks.shape[0], -1, d)


def write(cache: torch.Tensor, slots: torch.Tensor, x: torch.Tensor) -> None:
    # cache: [Hkv, num_blocks, bs, d]; slots: [T]; x: [T, Hkv, d]
    hkv, _, _, d = cache.shape
    cache.view(hkv, -1, d).index_copy_(1, slots, x.transpose(0, 1))


def attend_matmul(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  mask: torch.Tensor) -> torch.Tensor:
    # q: [n, H, d]; k, v: [Hkv, C, d]; mask: [n, C] bool (True = attend) -> [n, H, d]
    n, h, d = q.shape
    hkv, c = k.shape[0], k.shape[1]
    g = h // hkv
    qg = q.view(n, hkv, g, d).permute(1, 2, 0, 3).reshape(hkv, g * n, d)  # [Hkv, g*n, d]
    scores = torch.matmul(qg, k.transpose(1, 2)).view(hkv, g, n, c).float() * d**-0.5
    probs = scores.masked_fill(~mask, float("-inf")).softmax(-1).to(q.dtype)
    o = torch.matmul(probs.view(hkv, g * n, c), v)  # [Hkv, g*n, d]
    return o.view(hkv, g, n, d).permute(2, 0, 1, 3).reshape(n, h, d)


def attend_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor | None) -> torch.Tensor:
    # q: [n, H, d]; k, v: [Hkv, C, d]; mask: [n, C] bool, or None for causal with C == n
    o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k[None], v[None],
                                       attn_mask=mask, is_causal=mask is None, enable_gqa=True)
    return o[0].transpose(0, 1)  # [n, H, d]


def _causal(n: int, device: torch.device) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


def prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: Batch, kv: KVCache,
            layer: int, choice: LayerChoice) -> list[torch.Tensor]:
    """Each multi-token sequence's attention output [n, H, d], in `batch.prefills` order."""
    # q: [T, H, d]; k, v: [T, Hkv, d] (this batch's new tokens, already written to `kv`)
    outs = []
    for p in batch.prefills:
        qs = q[p.rows]  # [n, H, d]
        n = qs.shape[0]
        scores = n * (n if p.mask is None else p.mask.shape[1])  # query-key pairs (as gathered)
        if scores > choice.matmul_max_scores and choice.prefill != "sdpa":
            outs.append(native.prefill_attention(_heads_contiguous(qs), kv.keys[layer],
                                                 kv.values[layer], p.blocks, p.num_past,
                                                 choice.prefill))
            continue
        if p.num_past == 0:
            ks, vs = k[p.rows].transpose(0, 1), v[p.rows].transpose(0, 1)  # [Hkv, n, d]
        else:
            ks = gather(kv.keys[layer], p.blocks[None])[:, 0]  # [Hkv, C, d]
            vs = gather(kv.values[layer], p.blocks[None])[:, 0]
        if scores <= choice.matmul_max_scores:
            mask = p.mask if p.mask is not None else _causal(n, q.device)
            outs.append(attend_matmul(qs, ks, vs, mask))
        else:
            outs.append(attend_sdpa(qs, ks, vs, p.mask))
    return outs


def _heads_contiguous(x: torch.Tensor) -> torch.Tensor:
    # x: [n, H, d] -> the same, with each row's heads and d contiguous (no copy if they are)
    return x if x.stride(2) == 1 and x.stride(1) == x.shape[2] else x.contiguous()


def decode_matmul(q: torch.Tensor, g: DecodeGroup, ks: torch.Tensor,
                  vs: torch.Tensor) -> torch.Tensor:
    # q: [B, H, d]; ks, vs: [Hkv, B, C, d] -> [B, H, d]
    # NOTE: explicit matmuls over [Hkv, B] batches need no copy after the gather.
    b, h, d = q.shape
    hkv = ks.shape[0]
    qs = q.view(b, hkv, h // hkv, d).transpose(0, 1)  # [Hkv, B, g, d]
    scores = torch.matmul(qs, ks.transpose(2, 3)).float() * d**-0.5  # [Hkv, B, g, C]
    probs = scores.masked_fill(~g.mask, float("-inf")).softmax(-1).to(q.dtype)
    return torch.matmul(probs, vs).transpose(0, 1).reshape(b, h, d)


def decode_sdpa(q: torch.Tensor, g: DecodeGroup, ks: torch.Tensor,
                vs: torch.Tensor) -> torch.Tensor:
    # q: [B, H, d]; ks, vs: [Hkv, B, C, d] -> [B, H, d]
    mask = g.mask[0][:, None]  # [B, 1, 1, C]
    o = F.scaled_dot_product_attention(q[:, :, None], ks.transpose(0, 1), vs.transpose(0, 1),
                                       attn_mask=mask, enable_gqa=True)  # [B, H, 1, d]
    return o[:, :, 0]


def decode(q: torch.Tensor, batch: Batch, kv: KVCache, layer: int,
           choice: LayerChoice) -> torch.Tensor | None:
    """The single-token sequences' attention output [B, H, d], or None when there are none."""
    # q: [T, H, d]
    g = batch.decode
    if g is None:
        return None
    if choice.decode == "native":  # reads the paged cache in place: no gather
        return native.decode_attention(q[g.rows], kv.keys[layer], kv.values[layer], g.blocks,
                                       g.lens)
    ks = gather(kv.keys[layer], g.blocks)  # [Hkv, B, C, d]
    vs = gather(kv.values[layer], g.blocks)
    kernel = decode_sdpa if choice.decode == "sdpa" else decode_matmul
    return kernel(q[g.rows], g, ks, vs)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: Batch, kv: KVCache,
              layer: int, choice: LayerChoice) -> torch.Tensor:
    """Attend; this batch's K/V are already in the cache. -> [T, H, d]."""
    # q: [T, H, d]; k, v: [T, Hkv, d]
    pre = prefill(q, k, v, batch, kv, layer, choice)
    dec = decode(q, batch, kv, layer, choice)
    if dec is None and len(pre) == 1 and pre[0].shape[0] == q.shape[0]:
        return pre[0]  # one prefill fills the batch: no copy into a fresh buffer
    if not pre and dec is not None and dec.shape[0] == q.shape[0]:
        return dec  # decode rows are 0..B-1 when the batch holds only decodes
    out = torch.empty_like(q)  # [T, H, d]
    for p, o in zip(batch.prefills, pre, strict=True):
        out[p.rows] = o
    if dec is not None:
        assert batch.decode is not None
        out[batch.decode.rows] = dec
    return out
