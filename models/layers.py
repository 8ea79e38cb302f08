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
    """One decoder layer. q/k/v and gate/up are fused so each is one GEMM."""

    input_norm: torch.Tensor  # [D]
    qkv: torch.Tensor  # [H*d + 2*Hkv*d, D]
    qkv_bias: torch.Tensor | None  # [H*d + 2*Hkv*d]
    o: torch.Tensor  # [D, H*d]
    o_bias: torch.Tensor | None  # [D]
    post_norm: torch.Tensor  # [D]
    gate_up: torch.Tensor  # [2*I, D]
    down: torch.Tensor  # [D, I]

    def tensors(self) -> list[torch.Tensor]:
        ts = [self.input_norm, self.qkv, self.qkv_bias, self.o, self.o_bias, self.post_norm,
              self.gate_up, self.down]
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


def _prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: Batch,
                       kv: KVCache, layer: int, out: torch.Tensor) -> None:
    # q: [T, H, d]; k, v: [T, Hkv, d]; out: [T, H, d]
    for p in batch.prefills:
        qs = q[p.rows].transpose(0, 1)[None]  # [1, H, n, d]
        if p.context_slots is None:
            ks, vs = k[p.rows].transpose(0, 1)[None], v[p.rows].transpose(0, 1)[None]
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)
        else:
            ks = kv.keys[layer][p.context_slots].transpose(0, 1)[None]  # [1, Hkv, C, d]
            vs = kv.values[layer][p.context_slots].transpose(0, 1)[None]
            o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=p.mask, enable_gqa=True)
        out[p.rows] = o[0].transpose(0, 1)


def _decode_attention(q: torch.Tensor, batch: Batch, kv: KVCache, layer: int,
                      out: torch.Tensor) -> None:
    g = batch.decode
    if g is None:
        return
    qs = q[g.rows][:, :, None, :]  # [B, H, 1, d]
    ks = kv.keys[layer][g.context_slots].transpose(1, 2)  # [B, Hkv, Cmax, d]
    vs = kv.values[layer][g.context_slots].transpose(1, 2)
    o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=g.mask, enable_gqa=True)
    out[g.rows] = o[:, :, 0, :]


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
    kv.keys[layer][batch.slot_mapping] = k
    kv.values[layer][batch.slot_mapping] = v
    out = torch.empty_like(q)  # [T, H, d]
    _prefill_attention(q, k, v, batch, kv, layer, out)
    _decode_attention(q, batch, kv, layer, out)
    return F.linear(out.view(t, q_size), w.o, w.o_bias)


def mlp(x: torch.Tensor, w: LayerWeights) -> torch.Tensor:
    # x: [T, D] -> [T, D]
    gate, up = F.linear(x, w.gate_up).chunk(2, dim=-1)  # [T, I] each
    return F.linear(F.silu(gate) * up, w.down)


def decoder_layer(x: torch.Tensor, w: LayerWeights, dims: AttnDims, cos: torch.Tensor,
                  sin: torch.Tensor, batch: Batch, kv: KVCache, layer: int) -> torch.Tensor:
    # x: [T, D] -> [T, D]
    x = x + attention(rms_norm(x, w.input_norm, dims.eps), w, dims, cos, sin, batch, kv, layer)
    return x + mlp(rms_norm(x, w.post_norm, dims.eps), w)
