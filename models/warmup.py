"""Running a layer's GEMMs once at every row count a server meets, before serving.

Where layer groups pad their rows (`LayerChoice.pad_rows`), the row counts a
server meets are the small ones (up to `EXACT_ROWS`) and, above them, the
multiples of the pad. oneDNN builds each one's GEMM primitives the first time
it meets it (`python -m benchmarks.models first-runs`: +11 to +39 ms at 100-530 rows on
an AMX CPU); running them once at start-up, on the executors' thread count
(oneDNN keys its primitives by it), takes that off the first requests: about
1.1 s up to 512 rows on one thread for the default model.
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

WARM_ROWS = 512  # up to here by default; longer prompts pay once per pad, as before


def warm_rows(model: Model, threads: int, up_to: int = WARM_ROWS) -> list[int]:
    """Run the first layer's GEMMs at every row count a layer group runs up to `up_to`
    (above the native GEMV's), on `threads` threads -> the row counts run (none where the
    model pads nothing or is not on a CPU)."""
    pad = model.kernels.layer.pad_rows
    group = next((op for op in model.ops if isinstance(op, LayerGroupOp)), None)
    if pad <= 1 or group is None or model.device.type != "cpu":
        return []
    native = group.layers[0].qkv.native_rows
    rows = sorted({padded_rows(r, pad) for r in range(native + 1, up_to + 1)})

    def run() -> None:  # NOTE: oneDNN's primitives are cached process-wide
        with torch.inference_mode():
            for r in rows:
                layer_gemms(group.layers[0], r, model.dtype)()
    with startup_step(logger, f"warming the GEMMs at {len(rows)} row counts up to {up_to}"):
        in_own_thread(threads, run)
    return rows
