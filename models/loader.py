"""`load(spec)`: a model folder (or `default` / `tiny-random` / a cached hub id) to operators."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoConfig, PretrainedConfig

from models import kernels, tuning
from models.allocator import keep_heap_pages
from models.choices import PORTABLE, KernelChoice, LayerChoice
from models.config import ModelConfig, model_config, rope_inv_freq
from models.kv_cache import KVCache
from models.layers import AttnDims, LayerWeights
from models.linear import Linear
from models.lora import AdapterSet
from models.ops import EmbedOp, HeadOp, LayerGroupOp, Op
from models.steps import startup_step
from models.template import GraphTemplate, OpKind, OpTemplate
from models.variants import variant_ops, variant_templates

logger = logging.getLogger(__name__)

TARGET_GROUPS = 6  # NOTE: default split; `python -m benchmarks.models chain` prints per-op times

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Model:
    """A loaded model: its config, operator template and runnable operators."""

    name: str
    path: Path
    config: ModelConfig
    hf_config: PretrainedConfig
    dtype: torch.dtype
    device: torch.device
    template: GraphTemplate
    ops: list[Op]
    kernels: KernelChoice = PORTABLE  # what the CPU operators run (`models.tuning`)
    _on_device: dict[str, list[Op]] = field(default_factory=dict, repr=False)
    # the ops of the template's variant chains (models/variants.py), after `ops` by index
    variant_ops: list[Op] = field(default_factory=list, repr=False)
    _all_on_device: dict[str, list[Op]] = field(default_factory=dict, repr=False)
    # its LoRA adapters, added and removed at run time; every layer op (and copy) reads them
    adapters: AdapterSet = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.adapters = AdapterSet(self.lora_shapes(), self.config.num_layers, self.dtype)
        for op in self.ops:
            if isinstance(op, LayerGroupOp):
                op.adapters = self.adapters

    @property
    def num_layers(self) -> int:
        return self.config.num_layers

    def lora_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear an adapter may target (`models.lora`)."""
        c = self.config
        d, q, kv, i = c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, \
            c.intermediate_size
        return {"q": (d, q), "k": (d, kv), "v": (d, kv), "o": (q, d), "gate": (d, i),
                "up": (d, i), "down": (i, d)}

    def weight_bytes_on(self, device: str) -> int:
        """Bytes of weights `device` holds to run this model (a set: models/modelset.py)."""
        return self.template.weight_bytes

    def weights_note(self, device: str) -> str:
        """The weights `device` holds, for start-up errors."""
        return f"{self.name} {self.template.weight_bytes / 2**30:.2f} GiB"

    def ops_on(self, device: torch.device) -> list[Op]:
        """The operators with weights on `device` (CPU devices share the same tensors)."""
        if device == self.device or (device.type == "cpu" and self.device.type == "cpu"):
            return self.ops
        key = str(device)
        if key not in self._on_device:
            self._on_device[key] = [op.to(device) for op in self.ops]
        return self._on_device[key]

    def all_ops_on(self, device: torch.device) -> list[Op]:
        """`ops_on(device)` then the variants' ops on it, indexed by template index (what an
        executor runs). A variant op holds the layer weights of the chain's op on `device`."""
        if not self.variant_ops:
            return self.ops_on(device)
        key = str(device)
        if key not in self._all_on_device:
            chain = self.ops_on(device)
            same = chain is self.ops
            extra = self.variant_ops if same else variant_ops(self.template, chain)
            self._all_on_device[key] = [*chain, *extra]
        return self._all_on_device[key]

    def new_kv_cache(self, num_blocks: int, block_size: int = 16, layers: range | None = None,
                     device: torch.device | None = None) -> KVCache:
        c = self.config
        return KVCache(layers if layers is not None else range(c.num_layers), num_blocks,
                       block_size, c.num_kv_heads, c.head_dim, self.dtype, device or self.device)


def parse_dtype(name: str | torch.dtype | None, hf: PretrainedConfig) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    if name is None:
        name = str(getattr(hf, "dtype", None) or "float32").removeprefix("torch.")
    if name not in _DTYPES:
        raise ValueError(f"dtype {name!r} is not supported; use one of {', '.join(_DTYPES)}")
    return _DTYPES[name]


def resolve(spec: str) -> Path:
    """A spec to a local transformers folder (no network)."""
    if spec == "default":
        from models.default_model import prepare_default
        return prepare_default()
    if spec.startswith("tiny-random"):
        from models.tiny import tiny_random_dir
        return tiny_random_dir(spec.removeprefix("tiny-random").lstrip("-") or "llama")
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    return _hub_cache(spec)


def _hub_cache(spec: str) -> Path:
    from huggingface_hub import snapshot_download
    try:
        return Path(snapshot_download(spec, local_files_only=True))
    except Exception as e:
        raise FileNotFoundError(
            f"model {spec!r} is neither a folder, 'default', 'tiny-random', nor a hub id "
            f"in the local Hugging Face cache ({type(e).__name__})") from None


class _Weights:
    """Reads tensors by name from a folder's safetensors files, cast to dtype/device."""

    def __init__(self, path: Path, dtype: torch.dtype, device: torch.device) -> None:
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors weights in {path}")
        self._where = {}
        for f in files:
            with safe_open(f, framework="pt") as h:
                self._where.update({k: f for k in h.keys()})  # noqa: SIM118
        self.dtype, self.device = dtype, device

    def has(self, name: str) -> bool:
        return name in self._where

    def get(self, name: str) -> torch.Tensor:
        if name not in self._where:
            raise KeyError(f"weight {name!r} missing from the model folder")
        with safe_open(self._where[name], framework="pt") as h:
            return h.get_tensor(name).to(device=self.device, dtype=self.dtype)

    def maybe(self, name: str) -> torch.Tensor | None:
        return self.get(name) if self.has(name) else None


def _layer(w: _Weights, i: int) -> LayerWeights:
    p = f"model.layers.{i}."
    a = p + "self_attn."
    biases = [w.maybe(a + n + "_proj.bias") for n in "qkv"]
    qkv_bias = None if biases[0] is None else torch.cat(biases)  # type: ignore[arg-type]
    return LayerWeights(
        input_norm=w.get(p + "input_layernorm.weight"),
        qkv=Linear(torch.cat([w.get(a + n + "_proj.weight") for n in "qkv"]), qkv_bias, False),
        o=Linear(w.get(a + "o_proj.weight"), w.maybe(a + "o_proj.bias"), False),
        post_norm=w.get(p + "post_attention_layernorm.weight"),
        gate=Linear(w.get(p + "mlp.gate_proj.weight"), None, False),
        up=Linear(w.get(p + "mlp.up_proj.weight"), None, False),
        down=Linear(w.get(p + "mlp.down_proj.weight"), None, False),
    )


def _nbytes(ts: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


def _build_ops(w: _Weights, hf: PretrainedConfig, cfg: ModelConfig, k: int,
               itemsize: int) -> list[Op]:
    embed = w.get("model.embed_tokens.weight")
    ops: list[Op] = [EmbedOp(OpTemplate(0, "embed", OpKind.EMBED, range(0), _nbytes([embed]),
                                        cfg, itemsize), embed)]
    inv_freq, scale = rope_inv_freq(hf)
    dims = AttnDims(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps)
    for start in range(0, cfg.num_layers, k):
        layers = range(start, min(start + k, cfg.num_layers))
        lw = [_layer(w, i) for i in layers]
        t = OpTemplate(len(ops), f"layers[{layers.start}:{layers.stop}]", OpKind.LAYERS, layers,
                       sum(lay.nbytes for lay in lw), cfg, itemsize)
        ops.append(LayerGroupOp(t, lw, dims, inv_freq.to(w.device), scale, LayerChoice()))
    lm_head = embed if cfg.tie_word_embeddings else w.get("lm_head.weight")
    norm = w.get("model.norm.weight")
    head_bytes = _nbytes([norm] if cfg.tie_word_embeddings else [norm, lm_head])
    ops.append(HeadOp(OpTemplate(len(ops), "head", OpKind.HEAD, range(0), head_bytes, cfg,
                                 itemsize), norm, Linear(lm_head, None, False), cfg.rms_norm_eps))
    return ops


def default_layers_per_group(num_layers: int) -> int:
    return max(1, math.ceil(num_layers / TARGET_GROUPS))


def layer_weights(ops: list[Op]) -> list[LayerWeights]:
    return [w for op in ops if isinstance(op, LayerGroupOp) for w in op.layers]


def load(spec: str | Path, dtype: str | torch.dtype | None = None,
         device: torch.device | str = "cpu", layers_per_group: int | None = None,
         kernel_choice: KernelChoice | None = None, threads: int = 1,
         retune: bool = False, layer_groups: tuple[int, ...] = ()) -> Model:
    """Load a model and split it into operators (see `models.template`).

    `layer_groups` (at least two sizes; `models.variants.parse_group_sizes`): the chain
    groups the largest number of layers per operator, and each smaller size is a variant
    chain over the same weights (`models.variants`); it overrides `layers_per_group`.

    On a CPU device the operators run the kernels measured fastest on this
    machine for `threads` intra-op threads (`models.tuning`, cached on disk;
    `retune` measures afresh), unless `kernel_choice` forces some.
    """
    keep_heap_pages()
    path = resolve(str(spec))
    with startup_step(logger, f"loading model {spec} from {path}") as step:
        k = max(layer_groups) if layer_groups else layers_per_group
        model = _load(spec, path, dtype, device, k, kernel_choice, threads, retune)
        if layer_groups:
            with_variants(model, layer_groups)
        step.result = f"{model.config.num_layers} layers, {model.dtype}, on {model.device}"
    return model


def _load(spec: str | Path, path: Path, dtype: str | torch.dtype | None,
          device: torch.device | str, layers_per_group: int | None,
          kernel_choice: KernelChoice | None, threads: int, retune: bool) -> Model:
    hf = AutoConfig.from_pretrained(path)
    cfg = model_config(hf)
    dt = parse_dtype(dtype, hf)
    dev = torch.device(device)
    k = layers_per_group or default_layers_per_group(cfg.num_layers)
    if k < 1:
        raise ValueError("layers_per_group must be >= 1")
    itemsize = torch.empty((), dtype=dt).element_size()
    ops = _build_ops(_Weights(path, dt, dev), hf, cfg, k, itemsize)
    choice = PORTABLE
    if dev.type == "cpu":
        choice = kernel_choice or tuning.load_or_measure(layer_weights(ops), cfg, dt, threads,
                                                         refresh=retune).choice
        ops = kernels.apply(ops, choice, cfg.tie_word_embeddings)
    template = GraphTemplate(tuple(op.template for op in ops), k)
    return Model(str(spec), path, cfg, hf, dt, dev, template, ops, choice)


def with_variants(model: Model, sizes: tuple[int, ...]) -> Model:
    """`model` given a variant chain for each of `sizes` finer than its own groups (in
    place; `models.variants`). ValueError for a size that is not finer."""
    finer = tuple(k for k in sizes if k != model.template.layers_per_group)
    model.template = variant_templates(model.template, finer)
    model.variant_ops = variant_ops(model.template, model.ops)
    model._all_on_device.clear()
    return model
