"""`Linear` on float32 copies of a half-precision model's weights (`upcast`); invariant calls."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from models import native
from models.choices import GemmChoice
from models.linear import INVARIANT_ROWS, Linear, onednn_available

UPCASTS = {
    "aten": GemmChoice("aten", upcast=True),
    "onednn": GemmChoice("onednn", 16, upcast=True),
    "native": GemmChoice("aten", native_rows=4, upcast=True),
}


def _weights() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(48, 32, generator=g).to(torch.bfloat16)
    return w, torch.randn(48, generator=g).to(torch.bfloat16)


@pytest.mark.parametrize("name", sorted(UPCASTS))
@pytest.mark.parametrize("rows", [1, 3, 40])
def test_upcast_runs_in_float32_and_answers_in_the_model_dtype(name: str, rows: int) -> None:
    if name == "onednn" and not onednn_available(torch.float32):
        pytest.skip("oneDNN's packed linear is not in this torch build")
    if name == "native" and not native.supports(torch.float32):
        pytest.skip("no native kernels here")
    w, b = _weights()
    lin = Linear.build(w, b, UPCASTS[name])
    assert lin.upcast and lin.plain().dtype == torch.bfloat16
    assert torch.equal(lin.plain(), w) and torch.equal(lin.plain_bias(), b)  # type: ignore[arg-type]
    x = torch.randn(rows, 32, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    other = torch.randn(rows, 48, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    ref = F.linear(x.float(), w.float(), b.float())  # float32 arithmetic, one rounding at the end
    got = {"none": lin(x), "silu": lin.silu(x), "mul": lin.mul(x, other),
           "add": lin.add(x, other)}
    want = {"none": ref, "silu": F.silu(ref), "mul": ref * other.float(),
            "add": ref + other.float()}
    for k, y in got.items():
        assert y.dtype == torch.bfloat16, k
        torch.testing.assert_close(y.float(), want[k].to(torch.bfloat16).float(), rtol=8e-3,
                                   atol=1e-3, msg=k)


def test_upcast_weights_are_counted_at_their_float32_size() -> None:
    w, b = _weights()
    plain, up = Linear.build(w, b), Linear.build(w, b, GemmChoice("aten", upcast=True))
    assert up.weight.dtype == torch.float32 and plain.weight.dtype == torch.bfloat16
    assert up.nbytes == 2 * plain.nbytes
    moved = up.to(torch.device("cpu"))  # another device gets the model's dtype, plain aten
    assert not moved.upcast and moved.weight.dtype == torch.bfloat16


def test_upcast_is_nothing_for_a_float32_model() -> None:
    w, b = _weights()
    lin = Linear.build(w.float(), b.float(), GemmChoice("aten", upcast=True))
    assert not lin.upcast and lin.weight.dtype == torch.float32


def test_few_rows_run_on_the_model_dtype_copy_kept_beside() -> None:
    w, b = _weights()
    lin = Linear.build(w, b, GemmChoice("aten", upcast=True, half_rows=2))
    assert lin.half is not None and lin.half.weight.dtype == torch.bfloat16
    assert lin.nbytes == Linear.build(w, b).nbytes * 3  # float32 copy and the half one
    g = torch.Generator().manual_seed(3)
    for rows in (1, 2, 3):
        x = torch.randn(rows, 32, generator=g).to(torch.bfloat16)
        half = F.linear(x, w, b)  # bf16 arithmetic
        full = F.linear(x.float(), w.float(), b.float()).to(torch.bfloat16)
        assert torch.equal(lin(x), half if rows <= 2 else full), rows


@pytest.mark.skipif(not (native.supports(torch.bfloat16) and native.supports(torch.float32)),
                    reason="no native kernels here")
def test_few_rows_on_the_half_copy_take_the_native_gemv_within_its_rows() -> None:
    w, b = _weights()
    lin = Linear.build(w, b, GemmChoice("aten", native_rows=4, upcast=True, half_rows=2))
    assert lin.half is not None and lin.half.native_rows == 4
    g = torch.Generator().manual_seed(4)
    for rows in (1, 3, 5):
        x = torch.randn(rows, 32, generator=g).to(torch.bfloat16)
        want = native.linear(x, w, b) if rows <= 2 else (
            native.linear(x.float(), w.float(), b.float()).to(torch.bfloat16) if rows <= 4
            else F.linear(x.float(), w.float(), b.float()).to(torch.bfloat16))
        assert torch.equal(lin(x), want), rows


def test_the_gemv_for_few_rows_reads_weights_of_the_model_dtype() -> None:
    w, b = _weights()
    plain = Linear.build(w, b, GemmChoice("aten", native_rows=2))
    assert plain.gemv_for(2) is plain and plain.gemv_for(3) is None
    up = Linear.build(w, b, GemmChoice("aten", native_rows=4, upcast=True, half_rows=2))
    assert up.half is not None and up.gemv_for(2) is up.half  # the bf16 copy, not float32
    assert up.gemv_for(3) is None  # within native_rows, but on the float32 weights
    assert Linear.build(w, b, GemmChoice("aten", native_rows=4, upcast=True)).gemv_for(1) is None


@pytest.mark.parametrize("choice", [GemmChoice("aten", native_rows=1),
                                    GemmChoice("onednn", 16, native_rows=1),
                                    GemmChoice("aten", native_rows=1, upcast=True, half_rows=1)],
                         ids=["aten", "onednn", "upcast"])
def test_invariant_rows_compute_what_each_row_alone_does(choice: GemmChoice) -> None:
    if choice.backend == "onednn" and not onednn_available(torch.bfloat16):
        pytest.skip("oneDNN's packed bf16 linear is not in this torch build")
    w, b = _weights()
    lin = Linear.build(w, b, choice)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(INVARIANT_ROWS, 32, generator=g).to(torch.bfloat16)  # [R, K]
    other = torch.randn(INVARIANT_ROWS, 48, generator=g).to(torch.bfloat16)  # [R, N]
    alone = torch.cat([lin.add(x[i:i + 1], other[i:i + 1]) for i in range(len(x))])
    assert torch.equal(lin.add(x, other, invariant=True), alone)
    assert lin.gemv_for(INVARIANT_ROWS, invariant=True) is lin.gemv_for(1)
    assert lin.gemv_for(INVARIANT_ROWS + 1, invariant=True) is None


def test_without_invariance_more_rows_take_the_gemm() -> None:
    # NOTE: the reason for invariant calls: a GEMM's rows need not round as rows alone do
    w, b = _weights()
    lin = Linear.build(w, b, GemmChoice("aten", native_rows=1))
    x = torch.randn(INVARIANT_ROWS, 32, generator=torch.Generator().manual_seed(6))
    x = x.to(torch.bfloat16)
    assert lin.gemv_for(2) is None and lin.gemv_for(2, invariant=True) is lin
    assert torch.equal(lin(x), F.linear(x, w, b))
