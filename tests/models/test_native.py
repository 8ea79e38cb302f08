"""The native C kernels against the torch ops they replace, in fp32 and bf16."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from models import attention as attn
from models import native
from models.batch import Batch, SeqSpec, build_batch
from models.choices import GemmChoice, LayerChoice
from models.cpu import cpu_caps
from models.kernels import layer_for
from models.kv_cache import KVCache
from models.layers import (
    AttnDims,
    LayerWeights,
    apply_rope,
    decoder_layer,
    native_decoder_layer,
    rope_cos_sin,
    whole_layer_native,
)
from models.linear import Linear

needs_native = pytest.mark.skipif(native.library() is None,
                                reason="no C compiler: native kernels cannot be built here")
DTYPES = [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)]


def native_x86_avx2() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64") and cpu_caps().avx2


def _hf_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    # transformers' LlamaRMSNorm
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return w * x32.to(x.dtype)


@needs_native
@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("epilogue", ["none", "silu", "mul", "add"])
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 6, 9])
@pytest.mark.parametrize("prefetch", ["l1", "l2"])
def test_gemv_equals_linear(dtype: torch.dtype, tol: float, epilogue: str, rows: int,
                            prefetch: str) -> None:
    g = torch.Generator().manual_seed(rows)
    # N not a multiple of 4, K not a multiple of 16 or 32: every tail path runs
    x = torch.randn(rows, 70, generator=g)
    w, b = torch.randn(37, 70, generator=g) / 8, torch.randn(37, generator=g)
    other = torch.randn(rows, 37, generator=g)
    y = F.linear(x.to(dtype).float(), w.to(dtype).float(), b.to(dtype).float())
    want = {"none": y, "silu": F.silu(y), "mul": y * other.to(dtype).float(),
            "add": y + other.to(dtype).float()}[epilogue]
    got = native.linear(x.to(dtype), w.to(dtype), b.to(dtype), epilogue,
                        None if epilogue in ("none", "silu") else other.to(dtype), prefetch)
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [4, 5, 6, 7, 8, 11, 17])
def test_each_gemv_row_is_what_it_gives_alone(dtype: torch.dtype, rows: int) -> None:
    # tiles of 4, 5-6 (one pass over the weights) and their mix; K has a tail past 32
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 200, generator=g).to(dtype)  # [M, K]
    w = (torch.randn(43, 200, generator=g) / 8).to(dtype)  # [N, K]
    b = torch.randn(43, generator=g).to(dtype)
    other = torch.randn(rows, 43, generator=g).to(dtype)  # [M, N]
    for epilogue in ("silu", "add"):
        o = other if epilogue == "add" else None
        alone = torch.cat([native.linear(x[i:i + 1], w, b, epilogue,
                                         None if o is None else o[i:i + 1]) for i in range(rows)])
        assert torch.equal(native.linear(x, w, b, epilogue, o), alone)


@needs_native
@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_gemv_reads_strided_rows(dtype: torch.dtype, tol: float) -> None:
    x = torch.randn(3, 100).to(dtype)[:, :64]  # rows 100 apart
    w = torch.randn(20, 64).to(dtype)
    torch.testing.assert_close(native.linear(x, w, None).float(), F.linear(x, w).float(),
                               rtol=tol, atol=tol)


@needs_native
@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("dim", [64, 70])
def test_rms_norm_equals_transformers(dtype: torch.dtype, tol: float, dim: int) -> None:
    x, w = (torch.randn(9, dim) * 3).to(dtype), torch.randn(dim).to(dtype)
    torch.testing.assert_close(native.rms_norm(x, w, 1e-6).float(),
                               _hf_rms_norm(x, w, 1e-6).float(), rtol=tol, atol=tol)


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_and_kv_write_equal_torch(dtype: torch.dtype) -> None:
    t, h, hkv, d = 5, 4, 2, 48  # d/2 = 24: a vector body and a scalar tail
    qkv = torch.randn(t, (h + 2 * hkv) * d).to(dtype)
    cos, sin = rope_cos_sin(torch.arange(3, 3 + t), torch.rand(d // 2), 1.0, dtype)
    slots = torch.tensor([7, 2, 9, 30, 31])
    keys = torch.zeros(hkv, 4, 8, d, dtype=dtype)
    values = torch.zeros_like(keys)
    want_qk = apply_rope(qkv[:, :(h + hkv) * d].view(t, h + hkv, d), cos, sin)
    want_k, want_v = keys.clone(), values.clone()
    attn.write(want_k, slots, want_qk[:, h:])
    attn.write(want_v, slots, qkv[:, (h + hkv) * d:].view(t, hkv, d))
    got = qkv.clone()
    native.rope_write_(got, cos, sin, (h, hkv), keys, values, slots)
    # bf16 too: each product and sum is rounded where transformers rounds it
    torch.testing.assert_close(got[:, :(h + hkv) * d].view(t, h + hkv, d), want_qk,
                               rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(keys, want_k, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(values, want_v, rtol=0, atol=0)


@needs_native
@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("n,past,bs", [(1, 0, 16), (5, 0, 4), (37, 0, 16), (130, 0, 16),
                                       (9, 21, 4), (40, 17, 8)])
@pytest.mark.parametrize("h,hkv,d", [(6, 2, 32), (9, 3, 64), (4, 4, 16)])
def test_paged_prefill_attention_equals_sdpa(dtype: torch.dtype, tol: float, n: int, past: int,
                                             bs: int, h: int, hkv: int, d: int) -> None:
    # row blocks of 8 queries and key tiles of 16 with their tails; a past context; GQA
    g = torch.Generator().manual_seed(n + past)
    nb = -(-(past + n) // bs)
    table = torch.randperm(nb + 3, generator=g)[:nb]  # scattered blocks, others unused
    keys = (torch.randn(hkv, nb + 3, bs, d, generator=g) * 2).to(dtype)
    values = torch.randn(hkv, nb + 3, bs, d, generator=g).to(dtype)
    q = torch.randn(n, h, d, generator=g).to(dtype)
    ks = attn.gather(keys, table[None])[:, 0]  # [Hkv, nb * bs, d]
    vs = attn.gather(values, table[None])[:, 0]
    mask = torch.ones(n, nb * bs, dtype=torch.bool).tril(diagonal=past)
    want = attn.attend_sdpa(q, ks, vs, mask)
    got = native.prefill_attention(q, keys, values, table, past)
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


needs_amx = pytest.mark.skipif(not native.amx_ready(), reason="this CPU lacks AMX-BF16")


@needs_amx
@pytest.mark.parametrize("n,past,bs", [(1, 0, 16), (5, 0, 4), (37, 0, 16), (130, 0, 16),
                                       (9, 21, 4), (40, 17, 8), (300, 45, 16)])
@pytest.mark.parametrize("h,hkv,d", [(6, 2, 32), (9, 3, 64), (4, 4, 16), (4, 2, 128),
                                     (2, 1, 80)])
def test_amx_prefill_attention_equals_sdpa(n: int, past: int, bs: int, h: int, hkv: int,
                                           d: int) -> None:
    # blocks of 16 queries, four key tiles at a time and their tails, odd value chunks;
    # head dims padded to 32 for the scores (16, 80) and more than four output groups (128)
    g = torch.Generator().manual_seed(n + past + d)
    nb = -(-(past + n) // bs)
    table = torch.randperm(nb + 3, generator=g)[:nb]
    keys = (torch.randn(hkv, nb + 3, bs, d, generator=g) * 2).bfloat16()
    values = torch.randn(hkv, nb + 3, bs, d, generator=g).bfloat16()
    qkv = torch.randn(n, (h + 2 * hkv) * d, generator=g).bfloat16()
    q = qkv[:, :h * d].view(n, h, d)  # rows of a fused projection
    ks = attn.gather(keys, table[None])[:, 0]
    vs = attn.gather(values, table[None])[:, 0]
    mask = torch.ones(n, nb * bs, dtype=torch.bool).tril(diagonal=past)
    want = attn.attend_sdpa(q, ks, vs, mask)
    got = native.prefill_attention(q, keys, values, table, past, "amx")
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


@needs_native
def test_prefill_attention_reads_query_rows_of_a_fused_projection() -> None:
    qkv = torch.randn(20, (4 + 2 * 2) * 16)  # [T, (H + 2*Hkv) * d], q the first 64 columns
    q = qkv[:, :64].view(20, 4, 16)
    keys, values = torch.randn(2, 2, 16, 16), torch.randn(2, 2, 16, 16)
    table = torch.tensor([1, 0])
    got = native.prefill_attention(q, keys, values, table, 0)
    want = native.prefill_attention(q.contiguous(), keys, values, table, 0)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@needs_native
@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_paged_decode_attention_equals_sdpa(dtype: torch.dtype, tol: float) -> None:
    g = torch.Generator().manual_seed(3)
    h, hkv, d, bs = 6, 2, 32, 4
    keys = torch.randn(hkv, 24, bs, d, generator=g).to(dtype)
    values = torch.randn(hkv, 24, bs, d, generator=g).to(dtype)
    seqs = [SeqSpec(f"r{i}", [1], n - 1, blocks) for i, (n, blocks) in
            enumerate([(5, [3, 17]), (1, [0]), (13, [9, 2, 20, 4])])]
    batch = build_batch(seqs, bs, torch.device("cpu"))
    group = batch.decode
    assert group is not None
    q = torch.randn(3, h, d, generator=g).to(dtype)
    want = attn.decode_sdpa(q, group, attn.gather(keys, group.blocks),
                            attn.gather(values, group.blocks))
    got = native.decode_attention(q, keys, values, group.blocks, group.lens)
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


@needs_native
@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("bs,lens", [(16, [16, 17, 40, 1]), (4, [33, 15, 64]), (8, [300, 2])])
def test_paged_decode_attention_across_score_tiles(dtype: torch.dtype, tol: float, bs: int,
                                                   lens: list[int]) -> None:
    # contexts across the kernel's 16-token score tiles; scaled keys make scores span far
    # more than exp's range (weights of ~0 next to a dominant token)
    g = torch.Generator().manual_seed(5)
    h, hkv, d = 12, 3, 64
    nblocks = sum(-(-n // bs) for n in lens) + 3
    keys = (torch.randn(hkv, nblocks, bs, d, generator=g) * 4).to(dtype)
    values = torch.randn(hkv, nblocks, bs, d, generator=g).to(dtype)
    free = torch.randperm(nblocks, generator=g).tolist()
    seqs = []
    for i, n in enumerate(lens):
        k = -(-n // bs)
        blocks, free = free[:k], free[k:]
        seqs.append(SeqSpec(f"r{i}", [1], n - 1, blocks))
    group = build_batch(seqs, bs, torch.device("cpu")).decode
    assert group is not None
    q = (torch.randn(len(lens), h, d, generator=g) * 4).to(dtype)
    want = attn.decode_sdpa(q, group, attn.gather(keys, group.blocks),
                            attn.gather(values, group.blocks))
    got = native.decode_attention(q, keys, values, group.blocks, group.lens)
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


def _layer(dtype: torch.dtype, dim: int, inter: int, qkv_out: int, o_in: int,
           prefetch: str = "l1") -> LayerWeights:
    def lin(n: int, k: int, bias: bool = False) -> Linear:
        b = torch.randn(n).to(dtype) if bias else None
        return Linear((torch.randn(n, k) / k**0.5).to(dtype), b, False, native_rows=4,
                      prefetch=prefetch)
    return LayerWeights(torch.rand(dim).to(dtype) + 0.5, lin(qkv_out, dim, bias=True),
                        lin(dim, o_in), torch.rand(dim).to(dtype) + 0.5, lin(inter, dim),
                        lin(inter, dim), lin(dim, inter))


@needs_native
@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("prefetch", ["l1", "l2"])
def test_whole_native_layer_equals_op_by_op(dtype: torch.dtype, tol: float,
                                            prefetch: str) -> None:
    dims = AttnDims(num_heads=4, num_kv_heads=2, head_dim=16, eps=1e-6)
    w = _layer(dtype, 64, 96, (4 + 2 * 2) * 16, 4 * 16, prefetch)
    seqs = [SeqSpec("a", [1], 6, [1, 0]), SeqSpec("b", [2], 2, [3])]
    batch = build_batch(seqs, 8, torch.device("cpu"))
    cos, sin = rope_cos_sin(batch.positions, torch.rand(8), 1.0, dtype)
    x = torch.randn(2, 64).to(dtype)
    caches = [KVCache(range(1), 4, 8, 2, 16, dtype, torch.device("cpu")) for _ in range(2)]
    past_k, past_v = torch.randn_like(caches[0].keys[0]), torch.randn_like(caches[0].keys[0])
    for c in caches:  # the same past context in both
        c.keys[0].copy_(past_k)
        c.values[0].copy_(past_v)
    choice = LayerChoice(decode="native", norm_rope="native")
    want = decoder_layer(x, w, dims, cos, sin, batch, caches[0], 0, choice)
    got = native_decoder_layer(x, w, dims, cos, sin, batch, caches[1], 0)
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(caches[1].keys[0], caches[0].keys[0], rtol=0, atol=0)


@needs_native
def test_upcast_layers_run_the_whole_native_layer_on_their_half_copy() -> None:
    dims = AttnDims(num_heads=4, num_kv_heads=2, head_dim=16, eps=1e-6)
    w = _layer(torch.bfloat16, 64, 96, (4 + 2 * 2) * 16, 4 * 16)
    up = layer_for(w, GemmChoice("aten", native_rows=4, upcast=True, half_rows=2))
    assert up.qkv.upcast and up.qkv.weight.dtype == torch.float32
    choice = LayerChoice(decode_layer="native")

    def batch(rows: int) -> Batch:
        return build_batch([SeqSpec(f"r{i}", [1], 3, [i]) for i in range(rows)], 8,
                           torch.device("cpu"))
    assert whole_layer_native(batch(2), up, choice)
    assert not whole_layer_native(batch(3), up, choice)  # past half_rows: float32 weights
    b = batch(2)
    cos, sin = rope_cos_sin(b.positions, torch.rand(8), 1.0, torch.bfloat16)
    x = torch.randn(2, 64).to(torch.bfloat16)
    caches = [KVCache(range(1), 2, 8, 2, 16, torch.bfloat16, torch.device("cpu"))
              for _ in range(2)]
    got = native_decoder_layer(x, up, dims, cos, sin, b, caches[0], 0)
    want = native_decoder_layer(x, w, dims, cos, sin, b, caches[1], 0)  # the same bf16 weights
    assert torch.equal(got, want) and torch.equal(caches[0].keys[0], caches[1].keys[0])


def _python(code: str, cache: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "SLICEGATE_CACHE": str(cache), **env}
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True,
                          timeout=600, check=True)


@needs_native
def test_a_fresh_cache_builds_the_library_once(tmp_path: Path) -> None:
    code = "from models import native; print(native.note())"
    first = _python(code, tmp_path).stdout
    assert first.startswith("built with ") and str(tmp_path / "native") in first
    assert _python(code, tmp_path).stdout.startswith("cached with ")
    assert len(list((tmp_path / "native").glob("kernels-*.so"))) == 1


def test_without_a_compiler_the_kernels_are_off_and_never_chosen(tmp_path: Path,
                                                                 tiny_model_dir: Path) -> None:
    code = ("import json, models; from models import native; "
            f"m = models.load({str(tiny_model_dir)!r}, dtype='float32'); "
            "print(json.dumps([native.note(), m.kernels.to_dict()]))")
    done = _python(code, tmp_path, CC=str(tmp_path / "no-such-cc"))
    note, choice = json.loads(done.stdout.strip().splitlines()[-1])
    assert note.startswith("off: ") and "native CPU kernels are off" in done.stderr
    assert choice["gemm"]["native_rows"] == 0
    assert "native" not in (choice["layer"]["decode"], choice["layer"]["norm_rope"],
                            choice["layer"]["decode_layer"])
    record = json.loads(next((tmp_path / "kernels").glob("*.json")).read_text())
    assert record["native"] == note and record["key"]["native"] == ""  # no build
    assert not (tmp_path / "native").exists() or not list((tmp_path / "native").glob("*.so"))


@needs_native
@pytest.mark.skipif(not native_x86_avx2(), reason="an AVX2-only build needs an x86 CPU with AVX2")
def test_the_avx2_only_build_passes_these_tests(tmp_path: Path) -> None:
    """The portable vector code (no AVX512, no AVX512-BF16), as a CPU without them runs it
    (the AMX kernel's tests left out: that build has none)."""
    env = {**os.environ, "SLICEGATE_CACHE": str(tmp_path), "SLICEGATE_NATIVE_MARCH": "x86-64-v3"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           __file__, "-k", "not avx2_only and not fresh_cache and not compiler"
                           " and not amx"],
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:]
    assert " passed" in done.stdout and " skipped" not in done.stdout
    note = _python("from models import native; print(native.note())", tmp_path,
                   SLICEGATE_NATIVE_MARCH="x86-64-v3").stdout
    assert note.startswith("cached with ") and "-march=x86-64-v3" in note
