"""Prompt text to token ids: the fast path gives the ids `tokenizer.encode` gives."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from tokenizers import processors
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from gateway.prompts import encode

TEXTS = ["Hello", " leading space", "two  spaces\tand a tab\n", "ünïcödé 字 🚀",
         "<|im_start|>user\nhi<|im_end|>", "</s> an eos in the text", "a" * 300, "\n\n"]


@pytest.fixture(scope="module")
def with_bos(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """The tiny tokenizer, made to put a BOS token first (as Llama's do)."""
    raw = copy.deepcopy(tokenizer.backend_tokenizer)
    bos, bos_id = tokenizer.eos_token, tokenizer.eos_token_id
    raw.post_processor = processors.TemplateProcessing(single=f"{bos} $A",
                                                       special_tokens=[(bos, bos_id)])
    return PreTrainedTokenizerFast(tokenizer_object=raw, bos_token=bos)


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("bos", [False, True])
def test_encode_gives_the_tokenizers_own_ids(tokenizer: PreTrainedTokenizerBase,
                                             with_bos: PreTrainedTokenizerBase,
                                             text: str, bos: bool) -> None:
    tok = with_bos if bos else tokenizer
    ids = encode(tok, text)
    assert ids == list(tok.encode(text, add_special_tokens=True))
    if bos:
        assert ids == [tok.bos_token_id, *encode(tokenizer, text)]


def test_a_tokenizer_without_a_rust_backend_encodes_itself() -> None:
    class Slow:
        def encode(self, text: str, add_special_tokens: bool) -> list[int]:
            return [len(text), int(add_special_tokens)]

    slow: Any = Slow()
    assert encode(slow, "four") == [4, 1]
