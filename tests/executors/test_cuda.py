"""CudaExecutor: refuses non-CUDA devices and imports without CUDA; GPU runs where one exists."""

from __future__ import annotations

import pytest
import torch

from executors.cuda import CudaExecutor
from executors.executor import Executor, link
from executors.types import Device, OpInstance, OpRole, OpState
from models.batch import BatchSource, build_batch
from models.generate import run_chain
from models.loader import Model
from tests.executors.chains import BLOCK, Sink, chain_ops, make_rig, prefill, prompts


def _noop(op: OpInstance) -> None:
    return None


def test_refuses_a_cpu_device() -> None:
    with pytest.raises(ValueError, match="cuda:N"):
        CudaExecutor(Device("cpu:0", 1 << 30), _noop, _noop, None)


def test_cuda_device(tiny_model: Model) -> None:
    """Without a GPU: cuda:0 is refused. With one: a chain split over CPU and GPU agrees."""
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="not available"):
            CudaExecutor(Device("cuda:0", 1 << 30), _noop, _noop, None)
        return
    _chain_split_between_cpu_and_cuda_matches_cpu(tiny_model)


def _chain_split_between_cpu_and_cuda_matches_cpu(tiny_model: Model) -> None:
    names = ["cpu:0", "cuda:0"]
    rig = make_rig(tiny_model, names)
    rig.kv["cuda:0"] = tiny_model.new_kv_cache(32, BLOCK, device=torch.device("cuda:0"))
    batch = prefill(rig, prompts(tiny_model, 2, 9))
    gpu_batch = build_batch(batch.seqs, BLOCK, torch.device("cuda:0"))
    ops = chain_ops(tiny_model, batch, ["cpu:0", "cuda:0", "cuda:0", "cpu:0"])
    for op in ops:
        if op.device == "cuda:0" and op.role is OpRole.COMPUTE:
            op.batch = BatchSource.of(gpu_batch, BLOCK)
    sink = Sink()
    exs = {"cpu:0": Executor(Device("cpu:0", 1 << 30), rig.runner, sink, None),
           "cuda:0": CudaExecutor(Device("cuda:0", 1 << 30), rig.runner, sink, None)}
    link(list(exs.values()))
    try:
        for e in exs.values():
            e.start()
        for op in ops:
            exs[op.device].enqueue(op)
        sink.wait_finished(ops)
    finally:
        for e in exs.values():
            e.stop()
    assert all(op.state is OpState.DONE for op in ops), [op.error for op in ops]
    want = run_chain(tiny_model, batch, tiny_model.new_kv_cache(32, BLOCK))
    assert ops[-1].output.tolist() == want.tolist()
