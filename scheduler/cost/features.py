"""The features the cost estimators fit: an op's shape as a feature vector, per op kind.

`Estimators` (scheduler/cost/estimators.py) fits one linear model per (device
kind, op name) over `op_features`, masked by `op_mask` to the features that op
kind uses; a transfer's features are `XFER_FEATURES`. `device_kind` names the
kind of device that shares one set of estimators.
"""

from __future__ import annotations

import re

from executors.types import Device
from models.batch import BatchShape
from models.linear import INVARIANT_ROWS

# NOTE: num_context_tokens separates the KV read of batched decode (which pads to the
# longest context) from prefill attention; it halves the layer groups' error on CPU.
# Up to `native_rows` rows (measured at start-up: models.tuning) the CPU kernels run their
# native GEMV (a whole decode layer in one call); above, the GEMM kernels. native_rows
# counts the rows past the first within the GEMV's range, gemm_rows is 1 above it: without
# them one line through both regimes missed the layer groups' own profile by 10% on average,
# up to 24% (2.5% with gemm_rows).
OP_FEATURES = ("num_tokens", "attn_work", "num_seqs", "num_sampled", "num_context_tokens",
               "native_rows", "gemm_rows", "const")
_OP_MASKS = {  # which features each kind of op uses (by op name)
    "embed": (True, False, False, False, False, False, False, True),
    "layers": (True, True, True, False, True, True, True, True),
    "head": (True, False, False, True, False, False, False, True),
}
OP_SCALE = (1e3, 1e6, 1e2, 1e2, 1e4, 1.0, 1.0, 1.0)  # typical magnitudes (a well-posed fit)
XFER_FEATURES = ("num_bytes", "const")
XFER_SCALE = (1e6, 1.0)
_GROUP = re.compile(r"layers\[(\d+):(\d+)\]")


def runs_native(s: BatchShape, native_rows: int) -> bool:
    """Whether a step of `s` runs the native GEMV: within `native_rows` rows, or a verify
    step's decode rows (every sequence samples all it feeds, some more than one) within
    `INVARIANT_ROWS`, which run it whatever `native_rows` (`models.batch.Batch.row_invariant`)."""
    if s.num_tokens <= native_rows:
        return True
    verify = s.num_sampled > s.num_seqs and s.num_tokens == s.num_sampled
    return native_rows >= 1 and verify and s.num_tokens <= INVARIANT_ROWS


def op_features(s: BatchShape, native_rows: int = 1) -> tuple[float, ...]:
    native = runs_native(s, native_rows)
    return (s.num_tokens, s.attn_work, s.num_seqs, s.num_sampled, s.num_context_tokens,
            s.num_tokens - 1.0 if native else 0.0, 0.0 if native else 1.0, 1.0)


def op_mask(op_name: str) -> tuple[bool, ...]:
    op_name = op_name.rpartition("/")[2]  # a model set's `NAME/layers[0:5]`
    kind = "layers" if _GROUP.fullmatch(op_name) else op_name
    if kind not in _OP_MASKS:
        raise KeyError(f"no feature set for op {op_name!r}")
    return _OP_MASKS[kind]


def group_size(op_name: str) -> int | None:
    m = _GROUP.fullmatch(op_name.rpartition("/")[2])
    return int(m.group(2)) - int(m.group(1)) if m else None


def device_kind(name: str) -> str:
    """`cpu` for `cpu:N`; the GPU's name for `cuda:N` (`cuda` when CUDA is absent, or for a
    remote `NODE/cuda:N`, whose name is not known here)."""
    remote, _, local = name.rpartition("/")
    if local.startswith("cpu"):
        return "cpu"
    if remote:
        return "cuda"
    import torch  # NOTE: local so that reading estimators never initialises CUDA eagerly

    dev = Device(name, 1)
    if torch.cuda.is_available() and dev.index < torch.cuda.device_count():
        return torch.cuda.get_device_name(dev.index)
    return "cuda"
