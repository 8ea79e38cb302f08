"""loadgen.prompts: prompt texts of exact token counts, and model folder resolution."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from loadgen.prompts import PromptBuilder, resolve_model_folder


@pytest.fixture(scope="module")
def builder(tiny_model_dir: Path) -> PromptBuilder:
    return PromptBuilder.from_folder(tiny_model_dir)


def test_texts_have_the_exact_token_count(builder: PromptBuilder, tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    for salt, n in enumerate([1, 2, 3, 7, 16, 100, 511, 1500, 4000]):
        text = builder.text(n, salt)
        assert len(tokenizer(text, verbose=False)["input_ids"]) == n, (n, text[:80])


def test_each_salt_gives_a_different_prefix(builder: PromptBuilder) -> None:
    a, b = builder.text(64, "ide-1"), builder.text(64, "ide-2")
    assert a != b and a[:12] != b[:12]
    assert builder.text(64, "ide-1") == a  # deterministic


def test_rejects_nonpositive_counts(builder: PromptBuilder) -> None:
    with pytest.raises(ValueError, match="num_tokens must be >= 1"):
        builder.text(0, 0)


def test_resolve_model_folder(tiny_model_dir: Path) -> None:
    assert resolve_model_folder(str(tiny_model_dir)) == tiny_model_dir
    assert resolve_model_folder("tiny-random") == tiny_model_dir  # python -m models prepare
    with pytest.raises(RuntimeError, match="neither a model folder nor a model spec"):
        resolve_model_folder("no-such-model-spec")
