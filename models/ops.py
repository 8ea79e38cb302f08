"""Runnable operators: embedding, a group of decoder layers, and the head.

`op.run(batch, x, kv)` runs one operator for a batch; `x` is the previous
operator's output (None for the embedding). Operators hold weights, never
allocate KV blocks, and only write KV slots named by the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F

from models.batch import Batch, SeqSpec
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
from models.logprobs import HeadOutput, TokenLogprobs, chunks, prompt_rows, sampled_logprobs, scored
from models.lora import AdapterError, AdapterSet, LoraRows
from models.sampling import sample
from models.speculative import verify
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
    adapters: AdapterSet | None = None  # the model's LoRA adapters (shared by every copy)

    def _lora(self, batch: Batch, device: torch.device) -> LoraRows | None:
        """The batch's adapter rows (resolved once per batch and device), None without."""
        if not batch.has_adapters:
            return None
        if batch.lora is None:
            if self.adapters is None:
                raise AdapterError("this model serves no LoRA adapters")
            batch.lora = self.adapters.rows(batch.seqs, device)
        return batch.lora

    @torch.inference_mode()
    def run(self, batch: Batch, x: torch.Tensor | None, kv: KVCache | None) -> torch.Tensor:
        # x: [T, D] -> [T, D]
        assert x is not None and kv is not None
        cos, sin = rope_cos_sin(batch.positions, self.inv_freq, self.rope_scale, x.dtype)
        lora = self._lora(batch, x.device)
        whole = lora is None and whole_layer_native(batch, self.layers[0], self.layer)
        t = x.shape[0]
        if not whole:  # NOTE: oneDNN builds a GEMM primitive per row count; padding bounds them
            x = pad_to(x, padded_rows(t, self.layer.pad_rows))
        for layer, w in zip(self.template.layers, self.layers, strict=True):
            if whole:
                x = native_decoder_layer(x, w, self.dims, cos, sin, batch, kv, layer)
            else:
                x = decoder_layer(x, w, self.dims, cos, sin, batch, kv, layer, self.layer,
                                  lora)
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
        return self.rows_logits(x[batch.sample_rows], batch.row_invariant)

    def rows_logits(self, x: torch.Tensor, invariant: bool = False) -> torch.Tensor:
        # x: [R, D] -> [R, V] float32; `invariant`: each row as alone (`Batch.row_invariant`)
        return self.lm_head(rms_norm(x, self.norm, self.eps), invariant).float()

    @torch.inference_mode()
    def run(self, batch: Batch, x: torch.Tensor | None, kv: KVCache | None) -> Any:
        # -> [S] sampled token ids (long, on the CPU), or a HeadOutput when a row asks for
        # log-probs. NOTE: typed Any so that op chains (`x = op.run(batch, x, kv)`) read on
        assert x is not None
        if batch.wants_logprobs:
            return self._with_logprobs(batch, x)
        if batch.has_drafts:
            return self._verify(batch, x)
        if batch.sample_rows.numel() == 0:
            return torch.empty(0, dtype=torch.long)
        return torch.tensor(sample(self.logits(batch, x), batch.sampled_seqs), dtype=torch.long)

    def _verify(self, batch: Batch, x: torch.Tensor) -> HeadOutput:
        """Sampled sequences' tokens when some verify drafts: each one's run of tokens
        (one for a plain row; `models.speculative.verify` for a drafted one)."""
        runs = _runs(self.logits(batch, x), batch.sampled_seqs)
        return HeadOutput(torch.tensor([run[-1] for run in runs], dtype=torch.long),
                          [None] * len(runs), runs=runs)

    def _with_logprobs(self, batch: Batch, x: torch.Tensor) -> HeadOutput:
        seqs = batch.sampled_seqs
        tokens: list[int] = []
        logprobs: list[TokenLogprobs | None] = []
        runs: list[list[int]] | None = None
        if seqs:
            logits = self.logits(batch, x)  # [R, V], R = sum of num_scored
            # NOTE: raw log-probs: `sample` masks constrained rows' logits in place
            raw = logits.clone() if any(s.constraint is not None for s in seqs) else logits
            if batch.has_drafts:  # NOTE: drafted rows never ask for log-probs (`eligible`)
                runs = _runs(logits, seqs)
                tokens = [run[-1] for run in runs]
                raw = raw.index_select(0, _last_rows(seqs, raw.device))  # [S, V]
            else:
                tokens = sample(logits, seqs)
            logprobs = sampled_logprobs(raw, seqs, tokens)
        prompt = {s.request_id: self._prompt_logprobs(s, row, x)
                  for s, row in prompt_rows(batch.seqs)}
        return HeadOutput(torch.tensor(tokens, dtype=torch.long), logprobs, prompt, runs)

    def _prompt_logprobs(self, seq: SeqSpec, row: int, x: torch.Tensor) -> list[TokenLogprobs]:
        """Each fed row's next prompt token (`seq.prompt_targets`), scored."""
        # x: [T, D]; rows [row, row + len(targets)) predict the targets
        targets = seq.prompt_targets or []
        k = seq.sampling.prompt_logprobs or 0
        out: list[TokenLogprobs] = []
        for a, b in chunks(0, len(targets)):
            lp = torch.log_softmax(self.rows_logits(x[row + a:row + b]), -1)  # [r, V]
            out += scored(lp, torch.tensor(targets[a:b], device=x.device), k)
        return out

    def to(self, device: torch.device) -> HeadOp:
        return replace(self, norm=self.norm.to(device), lm_head=self.lm_head.to(device))


def _first_rows(seqs: list[SeqSpec]) -> list[int]:
    """Each sampled sequence's first scored row among the head's logits."""
    out, row = [], 0
    for s in seqs:
        out.append(row)
        row += s.num_scored
    return out


def _last_rows(seqs: list[SeqSpec], device: torch.device) -> torch.Tensor:
    return torch.tensor([r + s.num_draft for r, s in zip(_first_rows(seqs), seqs, strict=True)],
                        dtype=torch.long, device=device)  # [S]


def _runs(logits: torch.Tensor, seqs: list[SeqSpec]) -> list[list[int]]:
    """Each sequence's emitted tokens: plain rows sampled together, drafted ones verified."""
    # logits: [R, V], R = sum of num_scored
    firsts = _first_rows(seqs)
    plain = [s for s in seqs if not s.num_draft]
    index = torch.tensor([r for r, s in zip(firsts, seqs, strict=True) if not s.num_draft],
                         dtype=torch.long, device=logits.device)  # [P]
    sampled = iter(sample(logits.index_select(0, index), plain) if plain else [])
    return [verify(logits[r:r + s.num_scored], s) if s.num_draft else [next(sampled)]
            for r, s in zip(firsts, seqs, strict=True)]


Op = EmbedOp | LayerGroupOp | HeadOp
