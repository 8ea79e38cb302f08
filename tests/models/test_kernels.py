"""Every fast path forced on, against transformers: exact in fp32, within tolerance in bf16.

Each `KernelChoice` below turns one path on over the portable rest (plus one
with every native path at once); the chain runs a prefill, a chunk over past
KV beside a decode step, and decode-only steps (so a whole-layer native call
runs) against transformers' own forward on the same tokens.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

import models
from models import layers, native
from models.batch import SeqSpec, build_batch
from models.choices import GemmChoice, KernelChoice, LayerChoice
from models.cpu import cpu_caps
from models.generate import chain_logits
from models.linear import onednn_available

BLOCK = 4
NATIVE = native.library() is not None
X86 = platform.machine().lower() in ("x86_64", "amd64")

CHOICES: dict[str, KernelChoice] = {
    "aten": KernelChoice(),
    "onednn": KernelChoice(GemmChoice("onednn")),
    "onednn@16": KernelChoice(GemmChoice("onednn", 16)),
    "native-gemv": KernelChoice(GemmChoice("aten", native_rows=4)),
    "onednn+native-gemv": KernelChoice(GemmChoice("onednn", native_rows=4)),
    "prefill-matmul": KernelChoice(layer=LayerChoice(matmul_max_scores=1 << 30)),
    "prefill-native": KernelChoice(layer=LayerChoice(prefill="native")),
    "prefill-amx": KernelChoice(layer=LayerChoice(prefill="amx")),  # bf16 on AMX only
    "decode-matmul": KernelChoice(layer=LayerChoice(decode="matmul")),
    "decode-native": KernelChoice(layer=LayerChoice(decode="native")),
    "norm-rope-native": KernelChoice(layer=LayerChoice(norm_rope="native")),
    "all-native": KernelChoice(GemmChoice("onednn", native_rows=4),
                               LayerChoice(0, "native", "native", "native")),
    "all-native@l2": KernelChoice(GemmChoice("onednn", native_rows=4, prefetch="l2"),
                                  LayerChoice(0, "native", "native", "native", prefill="native")),
    "padded-rows": KernelChoice(layer=LayerChoice(pad_rows=16)),
    "onednn+padded-rows": KernelChoice(GemmChoice("onednn", native_rows=4),
                                       LayerChoice(0, "native", "native", "native", 16)),
    # GEMMs on float32 copies of the weights (a no-op for a float32 model)
    "fp32-gemm": KernelChoice(GemmChoice("aten", upcast=True)),
    "onednn+fp32-gemm": KernelChoice(GemmChoice("onednn", 16, upcast=True)),
    "fp32-gemm+half": KernelChoice(GemmChoice("aten", upcast=True, half_rows=1)),
    "fp32-gemm+half+native-gemv": KernelChoice(GemmChoice("aten", native_rows=4, upcast=True,
                                                          half_rows=1)),
    # the whole-layer native call reads weights of the model's dtype: upcast layers run op by op
    "all-native+fp32-gemm": KernelChoice(GemmChoice("onednn", native_rows=4, upcast=True),
                                         LayerChoice(0, "native", "native", "native", 16)),
    # ... but within `half_rows` it reads the model-dtype copy kept for few rows
    "all-native+fp32-gemm+half": KernelChoice(
        GemmChoice("onednn", native_rows=4, upcast=True, half_rows=4),
        LayerChoice(0, "native", "native", "native", 16)),
}


BF16_ONLY = {"prefill-amx"}  # AMX tiles compute in bf16: no float32 path to hold exact


def _available(name: str, dtype: torch.dtype) -> bool:
    c = CHOICES[name]
    uses_native = (c.gemm.native_rows > 0 or "native" in (
        c.layer.decode, c.layer.norm_rope, c.layer.decode_layer, c.layer.prefill))
    gemm_dtype = torch.float32 if c.gemm.upcast else dtype
    amx = c.layer.prefill == "amx"
    return ((c.gemm.backend != "onednn" or onednn_available(gemm_dtype))
            and (NATIVE or not uses_native)
            and (not amx or (dtype == torch.bfloat16 and native.amx_ready())))


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      max_position_embeddings=256, tie_word_embeddings=False)
    hf = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    path: Path = tmp_path_factory.mktemp("llama-d16")
    hf.save_pretrained(path)
    return path


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 97, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _ours(model: models.Model) -> list[torch.Tensor]:
    """Logits [S, V] of: a prefill pair, a chunk beside a decode, then two decode-only steps."""
    kv = model.new_kv_cache(64, BLOCK)
    tables = [kv.allocator.allocate(8), kv.allocator.allocate(8)]
    a, b = _tokens(14, 1), _tokens(6, 2)
    steps = [[SeqSpec("a", a[:5], 0, tables[0], True), SeqSpec("b", b, 0, tables[1], True)],
             [SeqSpec("a", a[5:], 5, tables[0], True), SeqSpec("b", [7], 6, tables[1], True)],
             [SeqSpec("a", [3], 14, tables[0], True), SeqSpec("b", [9], 7, tables[1], True)],
             [SeqSpec("a", [5], 15, tables[0], True)]]
    return [chain_logits(model, build_batch(s, BLOCK, model.device), kv) for s in steps]


def _want(hf: torch.nn.Module) -> list[torch.Tensor]:
    a, b = _tokens(14, 1), _tokens(6, 2)
    hist = {"a": a + [3, 5], "b": b + [7, 9]}
    rows = [[("a", 5), ("b", 6)], [("a", 14), ("b", 7)], [("a", 15), ("b", 8)], [("a", 16)]]
    with torch.no_grad():
        return [torch.stack([hf(torch.tensor([hist[r][:n]])).logits[0, -1].float()
                             for r, n in step]) for step in rows]


@pytest.fixture(autouse=True)
def pad_small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pad every batch where a choice pads rows (this file's batches are all small)."""
    monkeypatch.setattr(layers, "EXACT_ROWS", 0)


@pytest.mark.parametrize("name", sorted(set(CHOICES) - BF16_ONLY))
def test_fp32_equals_transformers(folder: Path, name: str) -> None:
    if not _available(name, torch.float32):
        pytest.skip(f"{name}: not available on this CPU")
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    model = models.load(folder, dtype="float32", kernel_choice=CHOICES[name])
    for got, want in zip(_ours(model), _want(hf), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", sorted(CHOICES))
def test_bf16_within_tolerance_of_transformers(folder: Path, name: str) -> None:
    if not _available(name, torch.bfloat16):
        pytest.skip(f"{name}: not available on this CPU")
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
    model = models.load(folder, dtype="bfloat16", kernel_choice=CHOICES[name])
    for got, want in zip(_ours(model), _want(hf), strict=True):
        scale = want.abs().max().item()
        torch.testing.assert_close(got, want, rtol=0.03, atol=0.03 * scale)


ISAS = {  # a CPU without AMX (AVX512-BF16 only), and one with AVX2 only, as far as this one can
    "avx512-bf16": ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16", "ATEN_CPU_CAPABILITY": "avx512",
                     "SLICEGATE_NATIVE_MARCH": "cooperlake"}, cpu_caps().avx512_bf16 and X86),
    "avx2": ({"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2",
              "SLICEGATE_NATIVE_MARCH": "x86-64-v3"}, cpu_caps().avx2 and X86),
}


@pytest.mark.parametrize("isa", sorted(ISAS))
def test_every_path_on_a_smaller_instruction_set(isa: str, tmp_path: Path) -> None:
    """This file's tests again with oneDNN, aten and the native kernels held to `isa`."""
    env, present = ISAS[isa]
    if not present:
        pytest.skip(f"this CPU lacks {isa}")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           __file__, "-k", "not smaller_instruction_set"],
                          env={**os.environ, "SLICEGATE_CACHE": str(tmp_path), **env},
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:]
    assert " passed" in done.stdout
