"""Variant chains (models/variants.py): finer layer groups over the same weights and KV."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import models
from models.batch import SeqSpec, build_batch
from models.kv_cache import KVCache, blocks_for
from models.loader import Model
from models.ops import LayerGroupOp
from models.sampling_params import SamplingParams
from models.skeleton import skeleton
from models.variants import parse_group_sizes, variant_templates
from scheduler.cost.oprunner import ShapeRunner
from tests.scheduler.cluster import CONFIG

PROMPT = [5, 17, 42, 99, 17, 5, 300, 8, 11, 23]


@pytest.fixture(scope="module")
def model(tiny_model_dir: Path) -> Model:
    # 4 layers: the chain runs them 4 to an op, the variants 2 and 1 to an op
    return models.load(tiny_model_dir, dtype="float32", layer_groups=(1, 2, 4))


def test_sizes_parse_largest_first_and_bad_ones_are_refused() -> None:
    assert parse_group_sizes("2, 10") == (10, 2)
    assert parse_group_sizes([3, 1, 3]) == (3, 1)
    for bad in ("4", "2,x", "0,2", ""):
        with pytest.raises(ValueError, match="layer groups"):
            parse_group_sizes(bad)


def test_a_variant_cuts_each_chain_group_and_numbers_its_ops_after_the_chain() -> None:
    t = skeleton(CONFIG, torch.float32, layer_groups=(3, 2)).template  # groups [0:3] [3:4]
    assert [o.name for o in t.chain()] == ["embed", "layers[0:3]", "layers[3:4]", "head"]
    assert [o.name for o in t.chain("", 2)] == ["embed", "layers[0:2]", "layers[2:3]",
                                                 "layers[3:4]", "head"]
    assert [o.index for o in t.all_ops] == list(range(len(t.all_ops)))
    assert all(t.op(i) is o for i, o in enumerate(t.all_ops))
    with pytest.raises(IndexError):
        t.op(len(t.all_ops))
    assert [t.base_index(o.index) for o in t.chain("", 2)] == [0, 1, 1, 2, 3]
    assert t.group_sizes == (3, 2)
    with pytest.raises(ValueError, match="not finer"):
        variant_templates(t, (3,))


def test_variants_hold_the_chain_layer_weights_and_add_no_bytes(model: Model) -> None:
    plain = models.load(model.path, dtype="float32")
    assert model.template.weight_bytes == plain.template.weight_bytes
    chain = {id(w) for op in model.ops if isinstance(op, LayerGroupOp) for w in op.layers}
    variant = [w for op in model.variant_ops if isinstance(op, LayerGroupOp) for w in op.layers]
    assert len(variant) == 2 * model.num_layers and {id(w) for w in variant} == chain
    ops = model.all_ops_on(torch.device("cpu"))
    assert [op.template.index for op in ops] == list(range(len(model.template.all_ops)))


def _step(model: Model, kv: KVCache, table: list[int], feed: list[int], past: int,
          size: int | None, generated: int) -> int:
    """One greedy step of the chain of `size` layers per op (None: the model's own)."""
    params = SamplingParams(temperature=0.0, max_tokens=8)
    seq = SeqSpec("r0", feed, past, table, sample=True, sampling=params,
                  num_generated=generated)
    batch = build_batch([seq], kv.block_size, model.device)
    ops = model.all_ops_on(model.device)
    x = None
    for t in model.template.chain("", size):
        x = ops[t.index].run(batch, x, kv)
    assert x is not None
    return int(x[0])


def _generate(model: Model, sizes: list[int | None]) -> tuple[list[int], KVCache]:
    """Prefill at `sizes[0]`, then one decode step at each next size."""
    kv = model.new_kv_cache(blocks_for(len(PROMPT) + len(sizes), 16), 16)
    table = kv.allocator.allocate(blocks_for(len(PROMPT) + len(sizes), 16))
    out, feed, past = [], list(PROMPT), 0
    for size in sizes:
        out.append(_step(model, kv, table, feed, past, size, len(out)))
        past += len(feed)
        feed = [out[-1]]
    return out, kv


def test_switching_variant_between_steps_gives_the_same_tokens_and_kv(model: Model) -> None:
    steady, kv = _generate(model, [None] * 6)
    switching, kv2 = _generate(model, [1, None, 2, 1, None, 2])
    assert switching == steady
    for layer in range(model.num_layers):
        torch.testing.assert_close(kv2.keys[layer], kv.keys[layer], rtol=0, atol=1e-6)
        torch.testing.assert_close(kv2.values[layer], kv.values[layer], rtol=0, atol=1e-6)


def test_profiling_times_every_variant_op(model: Model) -> None:
    runner = ShapeRunner(model, torch.device("cpu"), [((4,), (0,))], variants=True)
    times = runner.run_once(runner.batch(((4,), (0,))))
    assert len(times) == len(model.template.all_ops) and all(t > 0 for t in times)
