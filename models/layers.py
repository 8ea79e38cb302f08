"""Tensor code of one decoder layer over a flattened, paged batch.

Shapes: T = tokens in the batch, D = hidden size, H / Hkv = query / KV heads,
d = head dim, I = MLP intermediate size, C = context length.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from models.batch import Batch
from models.kv_cache import KVCache


@dataclass(slots=True)
class LayerWeights:
    """One decoder layer. q/k/v are fused into one GEMM.

    NOTE: gate and up stay two GEMMs: fused, the fp32 MLP measured ~2% slower (its
    activation runs on strided halves).
    """

    input_norm: torch.Tensor  # [D]
    qkv: torch.Tensor  # [H*d + 2*Hkv*d, D]
    qkv_bias: torch.Tensor | None  # [H*d + 2*Hkv*d]
    o: torch.Tensor  # [D, H*d]
    o_bias: torch.Tensor | None  # [D]
    post_norm: torch.Tensor  # [D]
    gate: torch.Tensor  # [I, D]
    up: torch.Tensor  # [I, D]
    down: torch.Tensor  # [D, I]

    def tensors(self) -> list[torch.Tensor]:
        ts = [self.input_norm, self.qkv, self.qkv_bias, self.o, self.o_bias, self.post_norm,
              self.gate, self.up, self.down]
        return [t for t in ts if t is not None]


@dataclass(frozen=True, slots=True)
class AttnDims:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    eps: float


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # x: [T, D]; computed in fp32 as transformers does
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, scale: float,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    # positions: [T] -> cos, sin: [T, 1, d]
    freqs = positions[:, None].float() * inv_freq[None, :]  # [T, d/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return ((emb.cos() * scale).to(dtype)[:, None, :], (emb.sin() * scale).to(dtype)[:, None, :])


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [T, heads, d]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _gather(cache: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    # cache: [Hkv, num_blocks, bs, d]; blocks: [B, nb] -> [Hkv, B, nb * bs, d] contiguous
    # NOTE: index_select of whole blocks; advanced indexing is ~10x slower on CPU.
    hkv, nb, bs, d = cache.shape
    rows = cache.view(hkv, nb, bs * d).index_select(1, blocks.flatten())
    return rows.view(hkv, blocks.shape[0], -1, d)


def _write(cache: torch.Tensor, slots: torch.Tensor, x: torch.Tensor) -> None:
    # cache: [Hkv, num_blocks, bs, d]; slots: [T]; x: [T, Hkv, d]
    hkv, _, _, d = cache.shape
    cache.view(hkv, -1, d)[:, slots] = x.transpose(0, 1)


MANUAL_MAX_SCORES = 512 * 512  # query x key pairs up to which half-precision uses matmuls


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
    return o[0].transpose(0, 1)


def _causal(n: int, device: torch.device) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


def _prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: Batch,
                       kv: KVCache, layer: int, out: torch.Tensor) -> None:
    # q: [T, H, d]; k, v: [T, Hkv, d]; out: [T, H, d]
    # NOTE: CPU's flash kernel is slower than two matmuls in bf16 at these sizes (~30% at
    # 512 tokens); in fp32 it is faster, and it needs no [n, C] score buffer.
    half = q.dtype in (torch.bfloat16, torch.float16)
    for p in batch.prefills:
        qs = q[p.rows]  # [n, H, d]
        if p.blocks is None:
            ks, vs = k[p.rows].transpose(0, 1), v[p.rows].transpose(0, 1)  # [Hkv, n, d]
        else:
            ks = _gather(kv.keys[layer], p.blocks[None])[:, 0]  # [Hkv, C, d]
            vs = _gather(kv.values[layer], p.blocks[None])[:, 0]
        if half and qs.shape[0] * ks.shape[1] <= MANUAL_MAX_SCORES:
            mask = p.mask if p.mask is not None else _causal(qs.shape[0], q.device)
            out[p.rows] = attend_matmul(qs, ks, vs, mask)
        else:
            out[p.rows] = attend_sdpa(qs, ks, vs, p.mask)


def _decode_attention(q: torch.Tensor, batch: Batch, kv: KVCache, layer: int,
                      out: torch.Tensor) -> None:
    # NOTE: explicit matmuls over [Hkv, B] batches: CPU SDPA kernels are slow for one
    # query row per sequence, and this layout needs no copy after the gather.
    g = batch.decode
    if g is None:
        return
    b, h, d = len(g.rows), q.shape[1], q.shape[2]
    hkv = kv.keys[layer].shape[0]
    qs = q[g.rows].view(b, hkv, h // hkv, d).transpose(0, 1)  # [Hkv, B, g, d]
    ks = _gather(kv.keys[layer], g.blocks)  # [Hkv, B, C, d]
    vs = _gather(kv.values[layer], g.blocks)
    scores = torch.matmul(qs, ks.transpose(2, 3)).float() * d**-0.5  # [Hkv, B, g, C]
    scores = scores.masked_fill(~g.mask, float("-inf")).softmax(-1).to(q.dtype)
    out[g.rows] = torch.matmul(scores, vs).transpose(0, 1).reshape(b, h, d)


def attention(x: torch.Tensor, w: LayerWeights, dims: AttnDims, cos: torch.Tensor,
              sin: torch.Tensor, batch: Batch, kv: KVCache, layer: int) -> torch.Tensor:
    # x: [T, D] (normed) -> [T, D]
    t = x.shape[0]
    q_size, kv_size = dims.num_heads * dims.head_dim, dims.num_kv_heads * dims.head_dim
    qkv = F.linear(x, w.qkv, w.qkv_bias)  # [T, H*d + 2*Hkv*d]
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    q = apply_rope(q.view(t, dims.num_heads, dims.head_dim), cos, sin)
    k = apply_rope(k.view(t, dims.num_kv_heads, dims.head_dim), cos, sin)
    v = v.view(t, dims.num_kv_heads, dims.head_dim)
    _write(kv.keys[layer], batch.slot_mapping, k)
    _write(kv.values[layer], batch.slot_mapping, v)
    out = torch.empty_like(q)  # [T, H, d]
    _prefill_attention(q, k, v, batch, kv, layer, out)
    _decode_attention(q, batch, kv, layer, out)
    return F.linear(out.view(t, q_size), w.o, w.o_bias)


def mlp(x: torch.Tensor, w: LayerWeights) -> torch.Tensor:
    # x: [T, D] -> [T, D]
    act = F.silu(F.linear(x, w.gate)).mul_(F.linear(x, w.up))  # [T, I]
    return F.linear(act, w.down)


def decoder_layer(x: torch.Tensor, w: LayerWeights, dims: AttnDims, cos: torch.Tensor,
                  sin: torch.Tensor, batch: Batch, kv: KVCache, layer: int) -> torch.Tensor:
    # x: [T, D] -> [T, D]
    # NOTE: in-place adds only on fresh tensors: `x` may be another op's output, kept for retry
    h = attention(rms_norm(x, w.input_norm, dims.eps), w, dims, cos, sin, batch, kv, layer)
    h.add_(x)
    return mlp(rms_norm(h, w.post_norm, dims.eps), w).add_(h)
