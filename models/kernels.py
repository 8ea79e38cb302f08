"""Applying a `KernelChoice` to a model's CPU operators.

Linear weights are re-laid out for the chosen GEMM backend; layer groups get
the attention and elementwise choice. The choice itself is measured by
`models.tuning`.
"""

from __future__ import annotations

from dataclasses import replace

from models.choices import GemmChoice, KernelChoice
from models.layers import LayerWeights
from models.linear import Linear
from models.ops import HeadOp, LayerGroupOp, Op


def _relayout(lin: Linear, gemm: GemmChoice) -> Linear:
    return Linear.build(lin.plain(), lin.plain_bias(), gemm)


def layer_for(w: LayerWeights, gemm: GemmChoice) -> LayerWeights:
    """`w` with its linear weights laid out for `gemm` (a copy; `w` is untouched)."""
    return LayerWeights(w.input_norm, _relayout(w.qkv, gemm), _relayout(w.o, gemm),
                        w.post_norm, _relayout(w.gate, gemm), _relayout(w.up, gemm),
                        _relayout(w.down, gemm))


def _head(op: HeadOp, gemm: GemmChoice, tied: bool) -> HeadOp:
    lm_head = _relayout(op.lm_head, gemm)
    # a tied lm_head re-laid out (or upcast) no longer shares the embedding's memory: count it
    extra = lm_head.nbytes if tied and (lm_head.packed or lm_head.upcast) else 0
    norm_bytes = op.norm.numel() * op.norm.element_size()
    own = norm_bytes + (0 if tied else lm_head.nbytes)
    return replace(op, lm_head=lm_head, template=replace(op.template, weight_bytes=own + extra))


def apply(ops: list[Op], choice: KernelChoice, tied: bool) -> list[Op]:
    """The operators re-laid out for `choice` (CPU weights only; the inputs are untouched)."""
    out: list[Op] = []
    for op in ops:
        if isinstance(op, LayerGroupOp):
            layers = [layer_for(w, choice.gemm) for w in op.layers]
            op = replace(op, layers=layers, layer=choice.layer,
                         template=replace(op.template, weight_bytes=sum(w.nbytes for w in layers)))
        elif isinstance(op, HeadOp):
            op = _head(op, choice.gemm, tied)
        out.append(op)
    return out
