"""The graph template: a model's operators in order, with shapes and costs known before running.

Every formula is a function of a `BatchShape`, so the scheduler can place and
cost an operator instance before any tensor exists.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from models.batch import BatchShape
from models.config import ModelConfig


class OpKind(enum.Enum):
    EMBED = "embed"
    LAYERS = "layers"
    HEAD = "head"


@dataclass(frozen=True, slots=True)
class OpTemplate:
    """One operator of the chain. Byte counts are at the model's dtype."""

    index: int  # position in the chain
    name: str  # "embed", "layers[0:5]", "head"
    kind: OpKind
    layers: range  # decoder layers inside (empty for embed/head)
    weight_bytes: int
    cfg: ModelConfig
    itemsize: int  # bytes per element of the model dtype

    def output_shape(self, s: BatchShape) -> tuple[int, ...]:
        if self.kind is OpKind.HEAD:
            return (s.num_sampled,)
        return (s.num_tokens, self.cfg.hidden_size)

    def flops(self, s: BatchShape) -> int:
        c = self.cfg
        if self.kind is OpKind.EMBED:
            return 0
        if self.kind is OpKind.HEAD:
            return 2 * s.num_sampled * c.hidden_size * c.vocab_size
        params = (c.hidden_size * (c.q_size + 2 * c.kv_size) + c.q_size * c.hidden_size
                  + 3 * c.hidden_size * c.intermediate_size)
        dense = 2 * s.num_tokens * params
        attn = 4 * s.attn_work * c.q_size  # QK^T and PV
        return len(self.layers) * (dense + attn)

    def activation_bytes(self, s: BatchShape) -> int:
        """Bytes of this op's output (what a Send moves) plus its largest transient buffer."""
        c = self.cfg
        if self.kind is OpKind.HEAD:
            return s.num_sampled * c.vocab_size * 4 + s.num_sampled * 8
        out = s.num_tokens * c.hidden_size * self.itemsize
        if self.kind is OpKind.EMBED:
            return out
        transient = s.num_tokens * 2 * c.intermediate_size * self.itemsize
        return out + transient

    def output_bytes(self, s: BatchShape) -> int:
        if self.kind is OpKind.HEAD:
            return s.num_sampled * 8
        return s.num_tokens * self.cfg.hidden_size * self.itemsize

    def kv_bytes(self, s: BatchShape) -> int:
        """KV bytes this op writes for the batch's new tokens."""
        return s.num_tokens * self.kv_bytes_per_token

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * len(self.layers) * self.cfg.kv_size * self.itemsize


@dataclass(frozen=True, slots=True)
class Variant:
    """The decoder layers of a one-model chain grouped `group_size` at a time
    (models/variants.py): layer-group ops numbered after the chain's own ops, each inside
    one of the chain's groups, running the same layer weights on the same KV."""

    group_size: int
    ops: tuple[OpTemplate, ...]  # OpKind.LAYERS only, in layer order


@dataclass(frozen=True, slots=True)
class GraphTemplate:
    """A model registered once: its operator chain. Instantiated per batch by the scheduler."""

    ops: tuple[OpTemplate, ...]
    layers_per_group: int
    # several models' chains laid end to end (models/modelset.py): (model, first index,
    # end index) each; empty for one model, whose chain is every op
    chains: tuple[tuple[str, int, int], ...] = ()
    # the chain's layers in finer groups (models/variants.py), finest first; empty: none
    variants: tuple[Variant, ...] = ()

    def chain(self, model: str = "", group_size: int | None = None) -> tuple[OpTemplate, ...]:
        """The operators of `model`'s chain: every op of a one-model template; of a model
        set, that member's (the first for ""). With `group_size` of a variant: the chain's
        embedding, that variant's layer groups and the chain's head."""
        if group_size is not None and group_size != self.layers_per_group:
            v = self.variant(group_size)
            return (self.ops[0], *v.ops, self.ops[-1])
        if not self.chains:
            return self.ops
        for name, start, stop in self.chains:
            if name == model or not model:
                return self.ops[start:stop]
        raise KeyError(f"no model {model!r} in this template")

    def variant(self, group_size: int) -> Variant:
        for v in self.variants:
            if v.group_size == group_size:
                return v
        raise KeyError(f"no variant of {group_size} layers per group in this template")

    @property
    def group_sizes(self) -> tuple[int, ...]:
        """Layers per group of every chain a plan may run, coarsest (the chain's own) first."""
        return (self.layers_per_group, *sorted((v.group_size for v in self.variants),
                                               reverse=True))

    @property
    def all_ops(self) -> tuple[OpTemplate, ...]:
        """The chain's ops, then every variant's: `all_ops[i].index == i` (what executors
        index their operators by)."""
        return self.ops + tuple(o for v in self.variants for o in v.ops)

    def op(self, index: int) -> OpTemplate:
        """The op of template index `index`, a variant's included."""
        i = index - len(self.ops)
        if i < 0:
            return self.ops[index]
        for v in self.variants:
            if i < len(v.ops):
                return v.ops[i]
            i -= len(v.ops)
        raise IndexError(f"no op {index} in this template")

    def base_index(self, index: int) -> int:
        """The chain's op that runs op `index`'s layers (`index` itself for a chain op): a
        variant op runs where that op is placed, on the KV of its layers there."""
        if index < len(self.ops):
            return index
        first = self.op(index).layers.start
        return next(o.index for o in self.ops if first in o.layers)

    @property
    def models(self) -> tuple[str, ...]:
        """The members' names of a model set; () for one model."""
        return tuple(name for name, _, _ in self.chains)

    @property
    def layer_groups(self) -> tuple[OpTemplate, ...]:
        return tuple(o for o in self.ops if o.kind is OpKind.LAYERS)

    @property
    def weight_bytes(self) -> int:
        return sum(o.weight_bytes for o in self.ops)

    def kv_bytes_per_token(self) -> int:
        return sum(o.kv_bytes_per_token for o in self.ops)
