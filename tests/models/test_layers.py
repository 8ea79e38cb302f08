"""The two attention paths agree, in fp32 and bf16, causal and over a prefix."""

from __future__ import annotations

import pytest
import torch

from models.attention import attend_matmul, attend_sdpa


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
