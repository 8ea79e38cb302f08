"""Variant chains: a model's decoder layers grouped into operators of several sizes at once.

A plan runs one chain: the model's own (`layers_per_group` layers per operator) or a
variant of finer groups, chosen per plan by the scheduler (docs/granularity.md). A
variant's layer groups cut each of the chain's groups into runs of at most
`group_size` layers, so every variant op lies inside one chain op and runs where that
op is placed. Its operators hold the very `LayerWeights` objects of the chain's
operators (no copy) and read and write the same per-layer KV: a request may run one
step at one granularity and the next at another.

NOTE: only decoder layers are regrouped; the embedding and the head are the chain's
own ops in every variant.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from models.ops import LayerGroupOp, Op
from models.template import GraphTemplate, OpTemplate, Variant


def parse_group_sizes(text: str | Iterable[int]) -> tuple[int, ...]:
    """`"2,10"` (or a list of ints) to distinct sizes, largest first. ValueError unless
    each is an integer >= 1 and there are at least two."""
    items = text.split(",") if isinstance(text, str) else list(text)
    try:
        sizes = sorted({int(str(x).strip()) for x in items}, reverse=True)
    except ValueError:
        raise ValueError(f"layer groups {text!r}: integers separated by commas, "
                         "e.g. 2,10") from None
    if len(sizes) < 2 or sizes[-1] < 1:
        raise ValueError(f"layer groups {text!r}: at least two distinct sizes >= 1")
    return tuple(sizes)


def _cut(layers: range, size: int) -> list[range]:
    return [range(a, min(a + size, layers.stop)) for a in range(layers.start, layers.stop, size)]


def variant_templates(template: GraphTemplate, sizes: Sequence[int]) -> GraphTemplate:
    """`template` with a variant of each size in `sizes` finer than its own groups.
    ValueError for a size not finer, or for a model set's template."""
    if template.chains:
        raise ValueError("layer-group variants need a one-model server")
    nxt = len(template.all_ops)
    variants: list[Variant] = list(template.variants)
    for size in sorted(sizes):
        if size >= template.layers_per_group:
            raise ValueError(f"a variant of {size} layers per group is not finer than the "
                             f"chain's {template.layers_per_group}")
        ops: list[OpTemplate] = []
        for group in template.layer_groups:
            for layers in _cut(group.layers, size):
                nbytes = group.weight_bytes * len(layers) // len(group.layers)
                ops.append(replace(group, index=nxt, name=f"layers[{layers.start}:{layers.stop}]",
                                   layers=layers, weight_bytes=nbytes))
                nxt += 1
        variants.append(Variant(size, tuple(ops)))
    return replace(template, variants=tuple(sorted(variants, key=lambda v: v.group_size)))


def variant_ops(template: GraphTemplate, chain_ops: Sequence[Op]) -> list[Op]:
    """The runnable ops of `template`'s variants (in `all_ops` order, after the chain's),
    built from `chain_ops`' layer groups: the same weight tensors, no copy."""
    groups = [op for op in chain_ops if isinstance(op, LayerGroupOp)]
    out: list[Op] = []
    for v in template.variants:
        for t in v.ops:
            owner = next(g for g in groups if t.layers.start in g.template.layers)
            lo = t.layers.start - owner.template.layers.start
            out.append(replace(owner, template=t, layers=owner.layers[lo:lo + len(t.layers)]))
    return out
