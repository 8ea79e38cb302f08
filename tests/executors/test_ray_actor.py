"""The device actor's class, in this process (no Ray): operators by id with kept outputs, a
transfer's fetch and pull, KV copies for swap and migration, release."""

from __future__ import annotations

import torch

from executors.ray_actor import ActorSpec, DeviceActor
from models.batch import SeqSpec, build_batch
from models.generate import run_chain
from models.loader import Model
from models.sampling_params import SamplingParams


def _actor(model: Model) -> DeviceActor:
    spec = ActorSpec(model.name, "float32", model.template.layers_per_group, "cpu:0", 1,
                     model.kernels.to_dict())
    actor = DeviceActor(spec)
    actor.configure(num_blocks=8, block_size=16)
    return actor


def test_ops_by_id_equal_the_chain_and_release_drops_them(tiny_model: Model) -> None:
    actor = _actor(tiny_model)
    seq = SeqSpec("a", [5, 6, 7, 8], 0, [0], sample=True,
                  sampling=SamplingParams(temperature=0))
    last = len(tiny_model.ops) - 1
    out, src = None, None
    for i in range(len(tiny_model.ops)):
        took, out = actor.compute(100 + i, i, 1, [seq] if i == 0 else None, 16, src, i != last)
        assert took > 0
        src = 100 + i
    want = run_chain(tiny_model, build_batch([seq], 16, torch.device("cpu")),
                     tiny_model.new_kv_cache(8, 16))
    assert out is not None and out.tolist() == want.tolist()
    assert set(actor.outputs) == {100 + i for i in range(last)}
    tensor, nbytes = actor.fetch(100)
    other = _actor(tiny_model)
    assert other.pull(7, tensor) == nbytes and torch.equal(other.outputs[7], actor.outputs[100])
    actor.release([100 + i for i in range(last)], [1])
    assert not actor.outputs and not actor.batches


def test_kv_copies_round_trip(tiny_model: Model) -> None:
    actor = _actor(tiny_model)
    assert actor.kv is not None
    for t in actor.kv.keys.values():
        t.normal_()
    layers = list(actor.kv.layers)
    kv = actor.gather_kv(layers, [1, 3])
    other = _actor(tiny_model)
    other.scatter_kv([4, 5], kv)
    assert other.kv is not None
    assert torch.equal(other.kv.keys[layers[0]][:, 4], actor.kv.keys[layers[0]][:, 1])
    assert torch.equal(other.kv.keys[layers[-1]][:, 5], actor.kv.keys[layers[-1]][:, 3])
