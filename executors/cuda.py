"""The executor of a CUDA device: ops run on the device's own stream.

The worker thread launches each op on this executor's stream, records a CUDA
event and waits on it (in the worker thread, never on the event loop), so
`(start, end)` covers the op's kernels. A SEND's copy is launched on the
source stream with `non_blocking`; the event recorded after it is the SEND's
output, and an op whose deps include that SEND makes its own stream wait on the
event before it launches. This module imports on machines without CUDA.
"""

from __future__ import annotations

import asyncio
from typing import Any

import torch

from executors.executor import Executor, OnDone, RunOp
from executors.types import Device, OpInstance, OpRole


class CudaExecutor(Executor):
    """`Executor` for `cuda:N`: one stream per executor, completion awaited by a CUDA event.

    `blocking_sync=True` makes the worker sleep while it waits instead of spinning
    (less CPU, a little more latency per op).
    """

    measures_cpu = False  # the op runs on the GPU; this thread launches and waits

    def __init__(self, device: Device, run_op: RunOp, on_done: OnDone,
                 loop: asyncio.AbstractEventLoop | None, intra_op_threads: int = 1,
                 blocking_sync: bool = False) -> None:
        if device.kind != "cuda":
            raise ValueError(f"CudaExecutor needs a cuda:N device, got {device.name}")
        if not torch.cuda.is_available() or device.index >= torch.cuda.device_count():
            raise RuntimeError(f"{device.name}: CUDA device not available")
        super().__init__(device, run_op, on_done, loop, intra_op_threads)
        self.blocking_sync = blocking_sync
        self.stream: torch.cuda.Stream | None = None  # made in the worker thread

    def _thread_init(self) -> None:
        super()._thread_init()
        torch.cuda.set_device(self.device.index)
        self.stream = torch.cuda.Stream(device=self.device.torch_device)

    def _prepare(self, op: OpInstance) -> bool:
        # NOTE: the batch's tensors are built inside `_run`, on this executor's stream (built
        # before it, their copies would run on the default stream, unordered with the op's)
        return False

    def _run(self, op: OpInstance) -> Any:
        stream = self.stream
        assert stream is not None, "the worker thread makes the stream"
        for dep in op.deps:
            if dep.role is OpRole.SEND and isinstance(dep.output, torch.cuda.Event):
                stream.wait_event(dep.output)  # the copy into our buffer is ordered first
        done = torch.cuda.Event(blocking=self.blocking_sync)
        with torch.cuda.stream(stream):
            out = self._run_op(op)
            done.record(stream)
        done.synchronize()
        return done if op.role is OpRole.SEND else out
