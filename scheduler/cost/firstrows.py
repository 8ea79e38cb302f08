"""The first run of a layer group at a row count the process has not run yet.

On a CPU, oneDNN builds (JIT-compiles) a GEMM primitive for every new row
count the first time it meets one and caches it process-wide (1,024
primitives by default): the first layer group a prompt of a new length runs
through takes about twice its usual time (+10-28 ms at 100-333 tokens on an
AMX CPU), the groups after it none (they share the primitives). Prompt lengths
vary, so a live server meets new row counts all the time; a prediction that
ignores it is low by that much (most of the simulator bench's end-to-end
error). `FirstRows` remembers the row counts issued, charges the first layer
group of a plan at an unseen count with the learnt ratio, and learns that
ratio from the charged ops instead of the estimators' online refit (which
would otherwise read each one as an outlier or a drift). Where layer groups
pad their rows (`LayerChoice.pad_rows`), a row count is its padded count.
"""

from __future__ import annotations

import statistics
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable

from executors.types import OpInstance, OpRole, OpState
from models.batch import BatchShape
from models.choices import KernelChoice
from models.layers import padded_rows
from models.template import GraphTemplate, OpKind

MIN_SAMPLES = 3  # charged ops observed before the ratio is applied
SEEN_CAPACITY = 128  # row counts remembered (the primitive cache holds ~8 per count)


class FirstRows:
    """See the module docstring. One per process (`PROCESS`), as the primitive cache is."""

    def __init__(self, window: int = 16) -> None:
        self.seen: OrderedDict[int, None] = OrderedDict()
        self.ratios: deque[float] = deque(maxlen=window)
        self.pending: dict[int, float] = {}  # op id -> its estimate without the charge
        self.pad = 0  # the CPU layer groups' row padding

    def reset(self) -> None:
        """Forget every row count and ratio (a fresh process; tests)."""
        self.seen.clear()
        self.ratios.clear()
        self.pending.clear()
        self.pad = 0

    def configure(self, kernels: KernelChoice) -> None:
        """Count rows as the CPU layer groups of `kernels` run them (padded or not)."""
        self.pad = kernels.layer.pad_rows

    def ran(self, rows: list[int]) -> None:
        """Remember row counts the process already ran (a warm-up; `models.warmup`)."""
        for r in rows:
            self.seen[r] = None
            self.seen.move_to_end(r)
        while len(self.seen) > SEEN_CAPACITY:
            self.seen.popitem(last=False)

    def rows(self, shape: BatchShape) -> int:
        """The row count a layer group's GEMMs run `shape` on."""
        return padded_rows(shape.num_tokens, self.pad)

    def ratio(self) -> float:
        """Median first-run time over the estimate, once learnt (else 1: no charge)."""
        if len(self.ratios) < MIN_SAMPLES:
            return 1.0
        return statistics.median(self.ratios)

    def charge(self, device: str, shape: BatchShape, est_s: float, charged: set[int]) -> float:
        """Seconds to add to a layer group's estimate `est_s`: the first-run extra where the
        row count is new to the process and not already charged in this plan (`charged`,
        updated)."""
        rows = self.rows(shape)
        if "cpu" not in device or rows in self.seen or rows in charged:
            return 0.0
        charged.add(rows)
        return est_s * (self.ratio() - 1.0)

    def issued(self, ops: Iterable[OpInstance], template: GraphTemplate,
               op_time: Callable[[str, str, BatchShape], float]) -> None:
        """Record the row counts of the issued ops' layer groups; the first of each new count
        is observed later (its estimate without the charge kept for that)."""
        for op in ops:
            if (op.role is not OpRole.COMPUTE
                    or template.op(op.template_index).kind is not OpKind.LAYERS):
                continue
            rows = self.rows(op.shape)
            if "cpu" in op.device and rows not in self.seen:
                self.pending[op.op_id] = op_time(op.device, op.name, op.shape)
                if len(self.pending) > SEEN_CAPACITY:  # NOTE: ops withdrawn before they ran
                    del self.pending[next(iter(self.pending))]
            self.ran([rows])

    def observed(self, op: OpInstance) -> bool:
        """True if `op` was a first run (its ratio learnt here, not by the estimators)."""
        base = self.pending.pop(op.op_id, None)
        if base is None:
            return False
        if op.state is OpState.DONE and op.start is not None and op.end is not None and base > 0:
            self.ratios.append((op.end - op.start) / base)
        return True


PROCESS = FirstRows()
