"""Types shared across the executor boundary (executors <- scheduler)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import torch

from models.batch import BatchShape, BatchSource


class Priority(enum.IntEnum):
    """Request class. Lower value runs first: HIGH (P0) > NORMAL (P1) > LOW (P2)."""

    HIGH = 0
    NORMAL = 1
    LOW = 2

    @classmethod
    def parse(cls, name: str) -> Priority:
        try:
            return cls[name.strip().upper()]
        except KeyError:
            raise ValueError(f"unknown priority {name!r}: use high, normal or low") from None

    @property
    def label(self) -> str:
        return self.name.lower()


class OpState(enum.Enum):
    """Lifecycle of one operator instance."""

    UNSCHEDULED = "unscheduled"  # in the GMG, not yet given to an executor
    ISSUED = "issued"  # in an executor's queue, waiting for inputs or its turn
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"

    @property
    def is_finished(self) -> bool:
        return self in (OpState.DONE, OpState.FAILED)


class OpRole(enum.Enum):
    COMPUTE = "compute"  # one operator of the model chain
    RECV = "recv"  # destination side of a transfer: allocates the buffer
    SEND = "send"  # source side: copies into the receiver's buffer
    # a wide plan's partner device lending its core (`executors.wide`): a CLAIM-named op that
    # ends at once, then one that holds the device until the plan's last op ends
    HOLD = "hold"


@dataclass(frozen=True, slots=True)
class Device:
    """A device slicegate schedules on: `cuda:N`, or a virtual CPU device `cpu:N`; with a
    node prefix (`NODE/cpu:0`, `NODE/cuda:1`) a device of another Ray node."""

    name: str
    memory_bytes: int  # budget for weights + KV + activations

    def __post_init__(self) -> None:
        node, _, local = self.name.rpartition("/")
        kind, _, index = local.partition(":")
        if kind not in ("cpu", "cuda") or not index.isdigit() or "/" in node:
            raise ValueError(f"device {self.name!r}: use cpu:N, cuda:N or NODE/cpu:N")
        if self.memory_bytes <= 0:
            raise ValueError(f"device {self.name}: memory budget must be > 0")

    @property
    def node(self) -> str | None:
        """The Ray node of a remote device (an IP address, node id or resource name)."""
        return self.name.rpartition("/")[0] or None

    @property
    def local_name(self) -> str:
        """The name on its own host: `cpu:0` for `NODE/cpu:0`."""
        return self.name.rpartition("/")[2]

    @property
    def torch_device(self) -> torch.device:
        # NOTE: every virtual CPU device is torch's one CPU device, with its own thread;
        # a remote device's tensors live in its actor (here: shapes only, on `meta`)
        if self.node is not None:
            return torch.device("meta")
        return torch.device("cpu") if self.kind == "cpu" else torch.device(self.name)

    @property
    def kind(self) -> str:
        return self.local_name.partition(":")[0]

    @property
    def index(self) -> int:
        return int(self.local_name.partition(":")[2])


@dataclass(eq=False, slots=True)
class OpInstance:
    """One operator (or transfer half) for one batch on one device.

    Shapes are known before it runs, so its memory and cost are too. `deps`
    must be DONE before it may start; `input` is the op whose output tensor
    it consumes (on this op's device by the time the deps are done).
    """

    op_id: int
    name: str  # template op name ("embed", "layers[0:5]", "head") or "recv"/"send"
    role: OpRole
    template_index: int  # index into the model's op chain; -1 for transfers
    device: str
    priority: Priority
    shape: BatchShape
    request_ids: tuple[str, ...]
    deps: tuple[OpInstance, ...] = ()
    input: OpInstance | None = None
    batch: BatchSource | None = None  # compute ops: this device's batch (tensors built lazily)
    peer: OpInstance | None = None  # SEND: its RECV (whose buffer it fills)
    # a wide plan's compute op: the HOLD on its partner device; while that runs, the op runs
    # on both devices' intra-op threads (`executors.wide`)
    wide: OpInstance | None = None
    est_s: float = 0.0  # estimated duration
    mem_bytes: int = 0  # activation bytes held from start until consumers finish
    transfer_bytes: int = 0  # RECV/SEND: bytes moved
    held_bytes: int = 0  # RECV: bytes reserved on its device's ledger until released
    state: OpState = OpState.UNSCHEDULED
    issued_at: float | None = None
    ready_at: float | None = None
    start: float | None = None
    end: float | None = None
    # NOTE: the worker thread's CPU time over (start, end) where an executor measures it; below
    # end - start, the rest was waiting (for the GIL, or for a core); with several intra-op
    # threads it includes the worker spinning at their barriers
    cpu_s: float | None = None
    output: Any = None
    error: BaseException | None = None
    attempts: int = 0

    @property
    def is_ready(self) -> bool:
        return all(d.state is OpState.DONE for d in self.deps)
