"""Tensor code of one decoder layer over a flattened, paged batch.

Shapes: T = tokens in the batch, D = hidden size, H / Hkv = query / KV heads,
d = head dim, I = MLP intermediate size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from models import attention as attn
from models import native
from models.batch import Batch
from models.choices import LayerChoice
from models.kv_cache import KVCache
from models.linear import Linear
from models.lora import LoraRows


@dataclass(slots=True)
class LayerWeights:
    """One decoder layer. q/k/v are fused into one GEMM.

    NOTE: gate and up stay two GEMMs: the gate's SiLU and the product with up fuse
    into their epilogues on oneDNN, and a fused [2I, D] GEMM would need a strided split.
    """

    input_norm: torch.Tensor  # [D]
    qkv: Linear  # [H*d + 2*Hkv*d, D] (+ bias on Qwen2)
    o: Linear  # [D, H*d]
    post_norm: torch.Tensor  # [D]
    gate: Linear  # [I, D]
    up: Linear  # [I, D]
    down: Linear  # [D, I]

    def linears(self) -> list[Linear]:
        return [self.qkv, self.o, self.gate, self.up, self.down]

    @property
    def nbytes(self) -> int:
        norms = (self.input_norm.numel() + self.post_norm.numel()) * self.input_norm.element_size()
        return norms + sum(lin.nbytes for lin in self.linears())

    def to(self, device: torch.device) -> LayerWeights:
        return LayerWeights(self.input_norm.to(device), self.qkv.to(device), self.o.to(device),
                            self.post_norm.to(device), self.gate.to(device), self.up.to(device),
                            self.down.to(device))


@dataclass(frozen=True, slots=True)
class AttnDims:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    eps: float


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # x: [T, D] -> [T, D]; statistics in fp32 as transformers computes them
    return F.rms_norm(x, weight.shape, weight, eps)


def norm(x: torch.Tensor, weight: torch.Tensor, eps: float, kernel: str) -> torch.Tensor:
    # x: [T, D] -> [T, D]
    if kernel == "native":
        return native.rms_norm(x if x.stride(1) == 1 else x.contiguous(), weight, eps)
    return rms_norm(x, weight, eps)


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, scale: float,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    # positions: [T] -> cos, sin: [T, 1, d]
    freqs = positions[:, None].float() * inv_freq[None, :]  # [T, d/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return ((emb.cos() * scale).to(dtype)[:, None, :], (emb.sin() * scale).to(dtype)[:, None, :])


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [T, heads, d] -> [T, heads, d]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos).add_(rotated.mul_(sin))


def rope_and_write(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dims: AttnDims,
                   kv: KVCache, layer: int, slots: torch.Tensor,
                   kernel: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """RoPE on q and k of the fused q/k/v output, K and V into their cache slots -> q, k, v."""
    # qkv: [T, (H + 2*Hkv) * d], a fresh tensor (native: rotated in place)
    t, h, hkv, d = qkv.shape[0], dims.num_heads, dims.num_kv_heads, dims.head_dim
    v = qkv[:, (h + hkv) * d:].view(t, hkv, d)
    if kernel == "native":  # one pass: rotate q and k, copy k and v to their slots
        native.rope_write_(qkv, cos, sin, (h, hkv), kv.keys[layer], kv.values[layer], slots)
        qk = qkv[:, :(h + hkv) * d].view(t, h + hkv, d)
    else:  # NOTE: q and k are adjacent in the fused output: one RoPE over [T, H + Hkv, d]
        qk = apply_rope(qkv[:, :(h + hkv) * d].view(t, h + hkv, d), cos, sin)
        attn.write(kv.keys[layer], slots, qk[:, h:])
        attn.write(kv.values[layer], slots, v)
    return qk[:, :h], qk[:, h:], v  # [T, H, d], [T, Hkv, d], [T, Hkv, d]


EXACT_ROWS = 64  # batches of up to this many rows (decode steps) never pad: few counts


def padded_rows(rows: int, pad: int) -> int:
    """The rows a layer group runs its GEMMs on: above `EXACT_ROWS`, `rows` up to the next
    multiple of `pad` (0: none). Small batches stay exact: padding them costs a decode step
    3-5% in copies, and their few row counts are met (or warmed) early."""
    if pad <= 1 or rows <= EXACT_ROWS:
        return rows
    return -(-rows // pad) * pad


def pad_to(x: torch.Tensor, rows: int) -> torch.Tensor:
    """`x` [T, ...] as [rows, ...], zeros after T (`x` itself when rows == T; a copy else)."""
    t = x.shape[0]
    if rows == t:
        return x
    out = x.new_empty((rows, *x.shape[1:]))
    out[:t].copy_(x)
    out[t:].zero_()
    return out


def attention_block(x: torch.Tensor, w: LayerWeights, dims: AttnDims, cos: torch.Tensor,
                    sin: torch.Tensor, batch: Batch, kv: KVCache, layer: int,
                    choice: LayerChoice, lora: LoraRows | None = None) -> torch.Tensor:
    # x: [R, D] (the layer's input; R >= T, rows past T padding) -> x + attention(norm(x))
    t = batch.slot_mapping.shape[0]
    inv = batch.row_invariant
    y = norm(x, w.input_norm, dims.eps, choice.norm_rope)  # [R, D]
    qkv = w.qkv(y, inv)  # [R, (H + 2*Hkv) * d]
    if lora is not None:
        lora.add("qkv", layer, y, qkv)
    q, k, v = rope_and_write(qkv[:t], cos, sin, dims, kv, layer, batch.slot_mapping,
                             choice.norm_rope)
    out = pad_to(attn.attention(q, k, v, batch, kv, layer, choice), x.shape[0])  # [R, H, d]
    h = w.o.add(out.reshape(x.shape[0], -1), x, inv)  # [R, D]
    if lora is not None:
        lora.add("o", layer, out.reshape(x.shape[0], -1), h)
    return h


def mlp_block(h: torch.Tensor, w: LayerWeights, eps: float, choice: LayerChoice,
              layer: int = 0, lora: LoraRows | None = None, inv: bool = False) -> torch.Tensor:
    # h: [T, D] -> h + mlp(norm(h)): [T, D]; `inv`: row-invariant GEMVs (`Batch.row_invariant`)
    y = norm(h, w.post_norm, eps, choice.norm_rope)
    if lora is not None and (lora.adapts("gate") or lora.adapts("up")):
        # NOTE: the adapters' products go in before SiLU and the product: no fused epilogues
        gate, up = w.gate(y, inv), w.up(y, inv)  # [T, I]
        lora.add("gate", layer, y, gate)
        lora.add("up", layer, y, up)
        act = F.silu(gate).mul_(up)
    else:
        act = w.up.mul(y, w.gate.silu(y, inv), inv)  # [T, I]
    out = w.down.add(act, h, inv)
    if lora is not None:
        lora.add("down", layer, act, out)
    return out


def decoder_layer(x: torch.Tensor, w: LayerWeights, dims: AttnDims, cos: torch.Tensor,
                  sin: torch.Tensor, batch: Batch, kv: KVCache, layer: int,
                  choice: LayerChoice, lora: LoraRows | None = None) -> torch.Tensor:
    # x: [T, D] -> [T, D]; `lora`: the batch's adapter rows, None when it has none
    # NOTE: `x` may be another op's output, kept for retry: it is never written in place
    h = attention_block(x, w, dims, cos, sin, batch, kv, layer, choice, lora)
    return mlp_block(h, w, dims.eps, choice, layer, lora, batch.row_invariant)


def whole_layer_native(batch: Batch, w: LayerWeights, choice: LayerChoice) -> bool:
    """A decode-only batch within the native GEMV's rows (a verify step's: the rows a single
    row takes) runs each layer as one native call (on the model-dtype copy of upcast
    weights: `Linear.gemv_for`)."""
    g = batch.decode
    return (choice.decode_layer == "native" and g is not None and not batch.prefills
            and all(lin.gemv_for(len(g.rows), batch.row_invariant) is not None
                    for lin in w.linears()))


def _gemv_weights(w: LayerWeights, rows: int, inv: bool) -> list[torch.Tensor | None]:
    # qkv, its bias, o, its bias, gate, up, down: what the native GEMVs read at `rows` rows
    lins = [lin.gemv_for(rows, inv) for lin in w.linears()]
    assert all(lin is not None for lin in lins), "not a native decode layer at these rows"
    qkv, o, gate, up, down = (lin for lin in lins if lin is not None)
    return [qkv.row_major(), qkv.bias, o.row_major(), o.bias, gate.row_major(), up.row_major(),
            down.row_major()]


def native_decoder_layer(x: torch.Tensor, w: LayerWeights, dims: AttnDims, cos: torch.Tensor,
                         sin: torch.Tensor, batch: Batch, kv: KVCache, layer: int) -> torch.Tensor:
    # x: [B, D] (one decode token per sequence) -> [B, D]; the kernels of `decoder_layer`
    g = batch.decode
    assert g is not None
    weights = [w.input_norm, w.post_norm, *_gemv_weights(w, x.shape[0], batch.row_invariant)]
    return native.decode_layer(x.contiguous(), weights, dims.eps,
                               (dims.num_heads, dims.num_kv_heads, dims.head_dim), cos, sin,
                               kv.keys[layer], kv.values[layer], batch.slot_mapping, g.blocks,
                               g.lens, w.qkv.prefetch)
