"""A model without weights: the operator template of a config, for scheduling without compute.

Schedulers, simulators and policies need only the chain's shapes, costs and
bytes; tests and virtual-clock benchmarks use a skeleton with fake executors
instead of loading weights. Its `ops` is empty, so nothing can run it.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import PretrainedConfig

from models.config import ModelConfig
from models.loader import Model, default_layers_per_group
from models.template import GraphTemplate, OpKind, OpTemplate
from models.variants import variant_templates


def _layer_params(c: ModelConfig) -> int:
    qkv = c.q_size + 2 * c.kv_size
    return (2 * c.hidden_size + c.hidden_size * qkv + (qkv if c.qkv_bias else 0)
            + c.q_size * c.hidden_size + 3 * c.hidden_size * c.intermediate_size)


def skeleton_template(c: ModelConfig, itemsize: int, layers_per_group: int) -> GraphTemplate:
    """The template `models.load` would build for `c`, weight bytes counted from the shapes."""
    ops = [OpTemplate(0, "embed", OpKind.EMBED, range(0), c.vocab_size * c.hidden_size * itemsize,
                      c, itemsize)]
    for start in range(0, c.num_layers, layers_per_group):
        layers = range(start, min(start + layers_per_group, c.num_layers))
        ops.append(OpTemplate(len(ops), f"layers[{layers.start}:{layers.stop}]", OpKind.LAYERS,
                              layers, len(layers) * _layer_params(c) * itemsize, c, itemsize))
    head = c.hidden_size + (0 if c.tie_word_embeddings else c.vocab_size * c.hidden_size)
    ops.append(OpTemplate(len(ops), "head", OpKind.HEAD, range(0), head * itemsize, c, itemsize))
    return GraphTemplate(tuple(ops), layers_per_group)


def skeleton(config: ModelConfig, dtype: torch.dtype = torch.float32,
             layers_per_group: int | None = None, name: str = "skeleton",
             layer_groups: tuple[int, ...] = ()) -> Model:
    """A `Model` with `config`'s template and KV layout, and no weights (see the module doc);
    `layer_groups` as `models.load` takes them (variant chains, `models.variants`)."""
    k = max(layer_groups) if layer_groups else (
        layers_per_group or default_layers_per_group(config.num_layers))
    itemsize = torch.empty((), dtype=dtype).element_size()
    template = skeleton_template(config, itemsize, k)
    if layer_groups:
        template = variant_templates(template, tuple(g for g in layer_groups if g != k))
    return Model(name, Path(name), config, PretrainedConfig(), dtype, torch.device("cpu"),
                 template, [])
