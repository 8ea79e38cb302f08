"""Running a layer's GEMMs once at every row count a server meets, before serving.

Where layer groups pad their rows (`LayerChoice.pad_rows`), the row counts a
server meets are the small ones (up to `EXACT_ROWS`) and, above them, the
multiples of the pad. oneDNN builds each one's GEMM primitives the first time
it meets it (`python -m benchmarks.models first-runs`: +11 to +39 ms at 100-530 rows on
an AMX CPU; +6-7 ms in the first layer group at 600-1024 rows on an AVX-512 one);
running them once at start-up, on the executors' thread count (oneDNN keys its
primitives by it), takes that off the first requests.

Nothing else in the chain pays a first run once these have run: on that AVX-512 CPU
(bf16, one thread, thread CPU time) the embedding, the head and sampler, attention at
new lengths and the native GEMV's decode batches ran within a few ms of their second
run, so the warm-up runs only these; about 2.1-2.4 s up to 1024 rows there, against
0.9 s up to 512, with other work on the machine.
"""

from __future__ import annotations

import logging

import torch

from models.cpu import in_own_thread
from models.layers import padded_rows
from models.loader import Model
from models.ops import LayerGroupOp
from models.probes import layer_gemms
from models.steps import startup_step

logger = logging.getLogger(__name__)

# NOTE: up to here, and no further: oneDNN's primitive cache holds 1,024 primitives, about
# 128 row counts (`scheduler.cost.firstrows.SEEN_CAPACITY`); at a pad of 16 the counts up to
# 1,024 rows are ~110 of them, and warming more would evict the first ones. Longer batches
# pay once per count, as before.
WARM_ROWS = 1024


def warm_limit(max_batch_tokens: int) -> int:
    """The largest row count to warm for a server feeding at most `max_batch_tokens` tokens
    per plan: every prompt (or chunk) a plan can carry, up to `WARM_ROWS`."""
    if max_batch_tokens < 1:
        raise ValueError(f"max_batch_tokens must be >= 1, got {max_batch_tokens}")
    return min(WARM_ROWS, max_batch_tokens)


def rows_to_warm(pad: int, native_rows: int, up_to: int) -> list[int]:
    """The row counts a layer group runs its GEMMs on for batches of `native_rows` + 1 to
    `up_to` tokens (fewer run the native GEMV, which builds nothing): each exact count up
    to `EXACT_ROWS`, then each multiple of `pad` (none where nothing is padded)."""
    if pad <= 1:
        return []
    return sorted({padded_rows(r, pad) for r in range(native_rows + 1, up_to + 1)})


def warm_rows(model: Model, threads: int, up_to: int = WARM_ROWS) -> list[int]:
    """Run the first layer's GEMMs at every row count a layer group runs up to `up_to`
    (above the native GEMV's), on `threads` threads -> the row counts run (none where the
    model pads nothing or is not on a CPU)."""
    pad = model.kernels.layer.pad_rows
    group = next((op for op in model.ops if isinstance(op, LayerGroupOp)), None)
    if pad <= 1 or group is None or model.device.type != "cpu":
        return []
    rows = rows_to_warm(pad, group.layers[0].qkv.native_rows, up_to)

    def run() -> None:  # NOTE: oneDNN's primitives are cached process-wide
        with torch.inference_mode():
            for r in rows:
                layer_gemms(group.layers[0], r, model.dtype)()
    with startup_step(logger, f"warming the GEMMs at {len(rows)} row counts up to {up_to}"):
        in_own_thread(threads, run)
    return rows
