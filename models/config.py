"""Architecture parameters read from a transformers config, with the support check."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import PretrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2")
_STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")


class UnsupportedModel(ValueError):
    """The model folder describes an architecture slicegate cannot run."""


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Decoder-only transformer shape. Units: counts unless named otherwise."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool  # Qwen2: q/k/v projections carry a bias
    eos_token_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise UnsupportedModel("num_attention_heads must be a multiple of num_key_value_heads")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim


def _eos_ids(hf: PretrainedConfig) -> tuple[int, ...]:
    eos = getattr(hf, "eos_token_id", None)
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list | tuple) else (int(eos),)


def _check_supported(hf: PretrainedConfig) -> None:
    mt = hf.model_type
    if mt not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModel(f"model_type {mt!r} is not supported; slicegate runs "
                               f"{', '.join(SUPPORTED_ARCHITECTURES)} (Llama-family, Qwen2)")
    if mt == "mistral" and getattr(hf, "sliding_window", None):
        raise UnsupportedModel("Mistral with sliding-window attention is not supported; "
                               "set sliding_window to null to run it with full attention")
    if getattr(hf, "hidden_act", "silu") != "silu":
        raise UnsupportedModel(f"hidden_act {hf.hidden_act!r} is not supported (only silu)")
    if getattr(hf, "mlp_bias", False):
        raise UnsupportedModel("mlp_bias=True is not supported")
    rope_type = rope_parameters(hf).get("rope_type", "default")
    if rope_type not in _STATIC_ROPE_TYPES:
        raise UnsupportedModel(f"rope_type {rope_type!r} is not supported; "
                               f"supported: {', '.join(_STATIC_ROPE_TYPES)}")


def rope_parameters(hf: PretrainedConfig) -> dict[str, Any]:
    params = getattr(hf, "rope_parameters", None) or {}
    return dict(params)


def model_config(hf: PretrainedConfig) -> ModelConfig:
    """Read and validate a transformers config; raises UnsupportedModel."""
    _check_supported(hf)
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    return ModelConfig(
        model_type=hf.model_type,
        vocab_size=hf.vocab_size,
        hidden_size=hf.hidden_size,
        intermediate_size=hf.intermediate_size,
        num_layers=hf.num_hidden_layers,
        num_heads=hf.num_attention_heads,
        num_kv_heads=getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads,
        head_dim=head_dim,
        rms_norm_eps=hf.rms_norm_eps,
        max_position_embeddings=hf.max_position_embeddings,
        tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
        qkv_bias=hf.model_type == "qwen2" or bool(getattr(hf, "attention_bias", False)),
        eos_token_ids=_eos_ids(hf),
    )


def rope_inv_freq(hf: PretrainedConfig) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [head_dim / 2] and the cos/sin scaling, as transformers computes."""
    rope_type = rope_parameters(hf).get("rope_type", "default")
    if rope_type != "default":
        inv_freq, scale = ROPE_INIT_FUNCTIONS[rope_type](hf, torch.device("cpu"))
        return inv_freq.float(), float(scale)
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    base = rope_parameters(hf).get("rope_theta", getattr(hf, "rope_theta", 10000.0))
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    return inv_freq, 1.0
