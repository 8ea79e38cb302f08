"""models.load: specs, dtypes, the operator template, and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config, MistralConfig

import models
from models.batch import BatchShape
from models.config import UnsupportedModel
from models.template import OpKind


def test_tiny_random_template(tiny_model_dir: Path) -> None:
    m = models.load("tiny-random", dtype="bfloat16", layers_per_group=2)
    names = [o.name for o in m.template.ops]
    assert names == ["embed", "layers[0:2]", "layers[2:4]", "head"]
    assert m.dtype is torch.bfloat16 and m.path == tiny_model_dir
    s = BatchShape(num_tokens=10, num_seqs=2, num_sampled=2, attn_work=60, num_context_tokens=12)
    group = m.template.ops[1]
    assert group.kind is OpKind.LAYERS and group.output_shape(s) == (10, 64)
    assert group.kv_bytes(s) == 10 * 2 * 2 * m.config.kv_size * 2
    assert group.flops(s) > group.flops(BatchShape(5, 1, 1, 30, 6)) > 0
    assert m.template.ops[-1].output_shape(s) == (2,)
    assert sum(o.weight_bytes for o in m.template.ops) == m.template.weight_bytes


def test_hub_id_in_the_local_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   tiny_model_dir: Path) -> None:
    snap = tmp_path / "models--acme--tiny" / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    for f in tiny_model_dir.iterdir():
        (snap / f.name).write_bytes(f.read_bytes())
    (tmp_path / "models--acme--tiny" / "refs").mkdir()
    (tmp_path / "models--acme--tiny" / "refs" / "main").write_text("0123abcd")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))
    assert models.load("acme/tiny").path == snap


def test_missing_model_is_a_clear_error() -> None:
    with pytest.raises(FileNotFoundError, match="not-a/model"):
        models.load("not-a/model")


def test_unsupported_architecture_names_the_supported_ones(tmp_path: Path) -> None:
    AutoModelForCausalLM.from_config(GPT2Config(n_layer=1, n_embd=32, n_head=2,
                                                vocab_size=50)).save_pretrained(tmp_path)
    with pytest.raises(UnsupportedModel, match="llama, mistral, qwen2"):
        models.load(tmp_path)


def test_sliding_window_mistral_is_refused(tmp_path: Path) -> None:
    cfg = MistralConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=2, num_key_value_heads=1, sliding_window=16)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path)
    with pytest.raises(UnsupportedModel, match="sliding"):
        models.load(tmp_path)


def test_bad_dtype_is_refused() -> None:
    with pytest.raises(ValueError, match="dtype"):
        models.load("tiny-random", dtype="int8")
