from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from models.default_model import is_complete
from models.tiny import build_tiny, corpus


def test_folder_loads_and_runs(tiny_model_dir: Path) -> None:
    assert is_complete(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert 1000 <= len(tok) <= 2000
    assert model.config.vocab_size == len(tok)
    assert model.config.model_type == "llama"
    assert model.config.tie_word_embeddings
    ids = tok("def foo(x): return x", return_tensors="pt").input_ids  # [1, S]
    with torch.no_grad():
        logits = model(ids).logits  # [1, S, V]
    assert logits.shape == (1, ids.shape[1], len(tok))


def test_special_tokens_and_chat_template(tiny_model_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert tok.eos_token == "<|im_end|>"
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [0, 1, 2]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    ids = tok(text).input_ids
    assert ids.count(tok.eos_token_id) == 2
    assert tok.decode(ids) == text


def test_qwen2_folder_is_untied(tiny_qwen2_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen2_dir)
    assert model.config.model_type == "qwen2"
    assert not model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_build_is_deterministic(tmp_path: Path, arch: str) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    build_tiny(first, arch)
    build_tiny(second, arch)
    assert (first / "tokenizer.json").read_bytes() == (second / "tokenizer.json").read_bytes()
    a = load_file(first / "model.safetensors")
    b = load_file(second / "model.safetensors")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_corpus_is_seeded() -> None:
    assert corpus(50) == corpus(50)
    assert corpus(50, seed=1) != corpus(50)


def test_unknown_arch_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown tiny arch"):
        build_tiny(tmp_path, "gpt2")
