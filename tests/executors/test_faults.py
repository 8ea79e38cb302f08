"""An injected op fault in a model chain: reported, others run, a retry gives the same output."""

from __future__ import annotations

import torch

from executors.types import OpInstance, OpRole, OpState
from models.generate import run_chain
from models.loader import Model
from tests.executors.chains import Sink, chain_ops, executors, make_rig, prefill, prompts

DEVICES = ["cpu:0", "cpu:1"]


class FailOnce:
    """Wraps a run_op: the first run of `target` raises, later runs go through."""

    def __init__(self, run_op: object, target_name: str) -> None:
        self.run_op, self.target_name, self.fired = run_op, target_name, False

    def __call__(self, op: OpInstance) -> object:
        if op.name == self.target_name and not self.fired:
            self.fired = True
            raise RuntimeError(f"injected fault in {op.name}")
        return self.run_op(op)  # type: ignore[operator]


def test_failed_op_is_retried_alone_and_output_is_unchanged(tiny_model: Model) -> None:
    rig = make_rig(tiny_model, DEVICES)
    batch = prefill(rig, prompts(tiny_model, 2, 8, seed=4))
    bystander_batch = prefill(rig, prompts(tiny_model, 1, 6, seed=5))
    ops = chain_ops(tiny_model, batch, ["cpu:0", "cpu:0", "cpu:1", "cpu:1"], rid="victim")
    failing = next(op for op in ops if op.name == "layers[2:4]")
    sink = Sink()
    with executors(DEVICES, FailOnce(rig.runner, "layers[2:4]"), sink) as exs:
        for op in ops:
            exs[op.device].enqueue(op)
        sink.wait_finished([failing])
        assert failing.state is OpState.FAILED
        assert "injected fault" in str(failing.error)
        bystander = chain_ops(tiny_model, bystander_batch, ["cpu:1"] * 4, rid="bystander")
        for op in bystander:
            exs[op.device].enqueue(op)
        sink.wait_finished(bystander)  # the executor keeps running other requests
        assert ops[-1].state is OpState.ISSUED  # the head waits on the failed op
        exs[failing.device].enqueue(failing)  # retry the failed node only
        sink.wait_finished(ops)
    assert all(op.state is OpState.DONE for op in ops)
    assert {op.name: op.attempts for op in ops if op.role is OpRole.COMPUTE} == {
        "embed": 1, "layers[0:2]": 1, "layers[2:4]": 2, "head": 1}
    assert [name for name, state in sink.events if state is OpState.FAILED] == ["layers[2:4]"]
    ref_kv = tiny_model.new_kv_cache(32, 16)
    want = run_chain(tiny_model, batch, ref_kv)
    assert torch.equal(ops[-1].output, want)
    assert torch.equal(bystander[-1].output, run_chain(tiny_model, bystander_batch, ref_kv))
