"""Runnable operators: embedding, a group of decoder layers, and the head.

`op.run(batch, x, kv)` runs one operator for a batch; `x` is the previous
operator's output (None for the embedding). Operators hold weights, never
allocate KV blocks, and only write KV slots named by the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from models.batch import Batch
from models.choices import LayerChoice
from models.kv_cache import KVCache
from models.layers import (
    AttnDims,
    LayerWeights,
    decoder_layer,
    native_decoder_layer,
    pad_to,
    padded_rows,
    rms_norm,
    rope_cos_sin,
    whole_layer_native,
)
from models.linear import Linear
from models.sampling import sample
from models.template import OpTemplate


@dataclass(slots=True)
class EmbedOp:
    template: OpTemplate
    embed: torch.Tensor  # [V, D]

    @torch.inference_mode()
    def run(self, batch: Batch, x: torch.Tensor | None, kv: KVCache | None) -> torch.Tensor:
        return F.embedding(batch.input_ids, self.embed)  # [T, D]

    def to(self, device: torch.device) -> EmbedOp:
        return replace(self, embed=self.embed.to(device))


@dataclass(slots=True)
class LayerGroupOp:
    template: OpTemplate
    layers: list[LayerWeights]
    dims: AttnDims
    inv_freq: torch.Tensor  # [d/2] float32
    rope_scale: float
    layer: LayerChoice  # attention and norm kernels (`models.kernels` applies the choice)

    @torch.inference_mode()
    def run(self, batch: Batch, x: torch.Tensor | None, kv: KVCache | None) -> torch.Tensor:
        # x: [T, D] -> [T, D]
        assert x is not None and kv is not None
        cos, sin = rope_cos_sin(batch.positions, self.inv_freq, self.rope_scale, x.dtype)
        whole = whole_layer_native(batch, self.layers[0], self.layer)
        t = x.shape[0]
        if not whole:  # NOTE: oneDNN builds a GEMM primitive per row count; padding bounds them
            x = pad_to(x, padded_rows(t, self.layer.pad_rows))
        for layer, w in zip(self.template.layers, self.layers, strict=True):
            if whole:
                x = native_decoder_layer(x, w, self.dims, cos, sin, batch, kv, layer)
            else:
                x = decoder_layer(x, w, self.dims, cos, sin, batch, kv, layer, self.layer)
        return x[:t]

    def to(self, device: torch.device) -> LayerGroupOp:
        return replace(self, layers=[w.to(device) for w in self.layers],
                       inv_freq=self.inv_freq.to(device), layer=LayerChoice())


@dataclass(slots=True)
class HeadOp:
    template: OpTemplate
    norm: torch.Tensor  # [D]
    lm_head: Linear  # [V, D]
    eps: float

    @torch.inference_mode()
    def logits(self, batch: Batch, x: torch.Tensor) -> torch.Tensor:
        # x: [T, D] -> [S, V] float32, for the sampled rows only
        h = rms_norm(x[batch.sample_rows], self.norm, self.eps)
        return self.lm_head(h).float()

    @torch.inference_mode()
    def run(self, batch: Batch, x: torch.Tensor | None, kv: KVCache | None) -> torch.Tensor:
        # -> [S] sampled token ids (long, on the CPU)
        assert x is not None
        if batch.sample_rows.numel() == 0:
            return torch.empty(0, dtype=torch.long)
        return torch.tensor(sample(self.logits(batch, x), batch.sampled_seqs), dtype=torch.long)

    def to(self, device: torch.device) -> HeadOp:
        return replace(self, norm=self.norm.to(device), lm_head=self.lm_head.to(device))


Op = EmbedOp | LayerGroupOp | HeadOp
