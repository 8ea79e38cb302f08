"""Tiny random-weight models for tests: built offline, deterministically, in seconds.

A byte-level BPE tokenizer is trained on a corpus that this module generates
from a fixed word list with a seeded RNG, so the folder is the same on every
machine. The model is a 4-layer Llama or Qwen2 with random weights drawn
under a fixed torch seed. Outputs are meaningless; shapes, templates and
special tokens are real.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import TYPE_CHECKING

from models.default_model import build_atomically, cache_root, is_complete

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

logger = logging.getLogger(__name__)

ARCHS = ("llama", "qwen2")
TINY_VERSION = "v1"  # NOTE: bump when the corpus, tokenizer or model recipe changes.
VOCAB_SIZE = 1536  # BPE target; the trained vocab may come out a little smaller
SEED = 0
EOT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [EOT, IM_START, IM_END]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# fmt: off
_WORDS = (
    "the", "a", "an", "of", "to", "in", "on", "at", "by", "for", "with", "from", "and", "or",
    "but", "not", "is", "are", "was", "were", "be", "been", "what", "which", "who", "where",
    "when", "why", "how", "this", "that", "these", "those", "it", "its", "they", "them", "we",
    "you", "capital", "city", "country", "river", "mountain", "ocean", "model", "token", "request",
    "tenant", "server", "device", "queue", "batch", "prefill", "decode", "layer", "cache",
    "memory", "latency", "deadline", "priority", "schedule", "France", "Paris", "Germany",
    "Berlin", "Italy", "Rome", "Spain", "Madrid", "Japan", "Tokyo", "Canada", "Ottawa", "red",
    "green", "blue", "small", "large", "fast", "slow", "first", "last", "next", "good", "bad",
    "new", "old", "run", "send", "receive", "allocate", "free", "compute", "write", "read", "open",
    "close", "start", "stop", "wait", "hello", "world", "thanks", "please", "question", "answer",
    "assistant", "user", "system", "def", "class", "return", "import", "from", "if", "else",
    "elif", "for", "while", "try", "except", "with", "lambda", "yield", "None", "True", "False",
    "self", "print", "len", "range", "list", "dict", "int", "str", "float", "async", "await", "x",
    "y", "z", "i", "j", "k", "n", "foo", "bar", "baz", "data", "value", "result", "items", "key",
)
# fmt: on
_CODE_BITS = ("()", "[]", "{}", "(x)", "[i]", ":", ",", ".", "=", "==", "+=", "->", "#", "_")
_PUNCT = (".", ".", ".", "?", "!", ",")


def tiny_random_dir(arch: str = "llama") -> Path:
    """Return the cached folder of the tiny random `arch` model, building it on first use."""
    _check_arch(arch)
    target = cache_root() / f"tiny-random-{arch}-{TINY_VERSION}"
    if is_complete(target):
        return target
    logger.info("building tiny random %s model in %s", arch, target)
    return build_atomically(target, lambda out: build_tiny(out, arch))


def build_tiny(out: Path, arch: str) -> None:
    """Write a tokenizer and a random-init `arch` model (safetensors) into folder `out`."""
    _check_arch(arch)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(out)
    _build_model(arch, tokenizer).save_pretrained(out)


def _check_arch(arch: str) -> None:
    if arch not in ARCHS:
        raise ValueError(f"unknown tiny arch {arch!r}; expected one of {ARCHS}")


def corpus(num_lines: int = 4000, seed: int = SEED) -> list[str]:
    """A deterministic mix of prose-like and code-like lines (no network, no machine state)."""
    rng = random.Random(seed)
    return [_code_line(rng) if i % 3 == 0 else _prose_line(rng) for i in range(num_lines)]


def _prose_line(rng: random.Random) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 14))]
    if rng.random() < 0.3:
        words.insert(rng.randrange(len(words)), str(rng.randint(0, 9999)))
    return " ".join(words).capitalize() + rng.choice(_PUNCT)


def _code_line(rng: random.Random) -> str:
    indent = "    " * rng.randint(0, 2)
    parts = [rng.choice(_WORDS) + rng.choice(_CODE_BITS) for _ in range(rng.randint(2, 7))]
    return indent + " ".join(parts)


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Train the byte-level BPE tokenizer and wrap it as a transformers fast tokenizer."""
    # NOTE: heavy imports stay here so that a cached `tiny_random_dir()` never imports them.
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=IM_START,
        eos_token=IM_END,
        unk_token=EOT,
        pad_token=EOT,
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
    )


def _build_model(arch: str, tokenizer: PreTrainedTokenizerFast) -> PreTrainedModel:
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, LlamaConfig, Qwen2Config

    config_cls = LlamaConfig if arch == "llama" else Qwen2Config
    config = config_cls(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,  # head_dim = 64 / 4 = 16 (Qwen2Config has no head_dim field)
        max_position_embeddings=4096,
        tie_word_embeddings=(arch == "llama"),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )
    return model
