"""The two attention paths agree, in fp32 and bf16, causal and over a prefix; row padding."""

from __future__ import annotations

import pytest
import torch

from models.attention import attend_matmul, attend_sdpa
from models.layers import EXACT_ROWS, pad_to, padded_rows


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("past", [0, 7])
def test_matmul_attention_equals_sdpa(dtype: torch.dtype, tol: float, past: int) -> None:
    g = torch.Generator().manual_seed(past)
    n, h, hkv, d = 13, 6, 2, 16
    q = torch.randn(n, h, d, generator=g).to(dtype)
    k = torch.randn(hkv, n + past, d, generator=g).to(dtype)
    v = torch.randn(hkv, n + past, d, generator=g).to(dtype)
    mask = torch.ones(n, n + past, dtype=torch.bool).tril(diagonal=past)
    want = attend_sdpa(q, k, v, mask if past else None)
    got = attend_matmul(q, k, v, mask)
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


def test_rows_pad_to_the_next_multiple_above_the_small_batches() -> None:
    assert [padded_rows(r, 16) for r in (1, 3, EXACT_ROWS, 65, 100, 112)] == [
        1, 3, EXACT_ROWS, 80, 112, 112]
    assert padded_rows(100, 0) == 100  # nothing padded
    x = torch.arange(6.0).view(3, 2)
    assert pad_to(x, 3) is x
    got = pad_to(x, 5)
    assert got.shape == (5, 2) and torch.equal(got[:3], x) and not got[3:].any()
