"""Synthetic prompt text of an exact token count, calibrated with the served model's tokenizer.

Traces carry token counts, not text. ``PromptBuilder.text(n, salt)`` returns
code-like text that the tokenizer encodes to ``n`` tokens (as the server
counts them, special tokens included). Each prompt starts with a hash of
``salt``, so no two requests share a prefix and no server gets prefix
cache hits that the trace did not ask for.

The tokenizer is loaded from a model folder with ``transformers``; a model
spec (``default``, ``tiny-random``) is turned into its folder by running
``python -m models prepare SPEC`` in a subprocess (loadgen imports no other
slicegate package).
"""

from __future__ import annotations

import hashlib
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

_WORDS = (
    "def", "return", "self", "value", "index", "result", "items", "config", "request", "response",
    "token", "cache", "import", "from", "class", "None", "True", "False", "if", "else", "elif",
    "for", "while", "in", "not", "and", "or", "with", "as", "try", "except", "raise", "yield",
    "async", "await", "lambda", "list", "dict", "set", "tuple", "len", "range", "print", "data",
    "path", "name", "key", "args", "kwargs", "start", "end", "size", "count", "total", "buffer",
    "offset", "limit", "parse", "load", "save", "open", "close", "read", "write", "update",
    "create", "delete", "get", "put", "status", "error", "node", "graph", "device", "queue",
    "batch", "layer", "weight", "shape", "stream", "event", "timer", "score", "plan",
)
_CALIBRATION_STEPS = 8


def resolve_model_folder(spec_or_folder: str, python: str = sys.executable) -> Path:
    """A model folder: ``spec_or_folder`` itself if it is one, else ``python -m models prepare``."""
    folder = Path(spec_or_folder).expanduser()
    if folder.is_dir():
        return folder
    try:
        done = subprocess.run(
            [python, "-m", "models", "prepare", spec_or_folder],
            capture_output=True, text=True, timeout=1800, check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"could not run `python -m models prepare {spec_or_folder}`: "
                           f"{exc}") from exc
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines or not Path(lines[-1]).is_dir():
        tail = done.stderr.strip()[-500:]
        raise RuntimeError(f"{spec_or_folder!r} is neither a model folder nor a model spec "
                           f"that `python -m models prepare` knows: {tail}")
    return Path(lines[-1])


class PromptBuilder:
    """Makes unique prompt texts of exact token counts (see the module docstring)."""

    def __init__(self, count: Callable[[str], int], decode: Callable[[list[int]], str],
                 encode: Callable[[str], list[int]], seed: int = 0) -> None:
        self._count = count  # tokens of a text as the server counts them (special tokens too)
        self._decode = decode
        self._encode = encode  # token ids of a text without special tokens
        self._rng = random.Random(seed)
        self._body_ids: list[int] = []
        self._body_len: dict[int, int] = {}  # prompt tokens -> body tokens last used

    @classmethod
    def from_folder(cls, folder: str | Path, seed: int = 0) -> PromptBuilder:
        """Load the tokenizer of a model folder (transformers ``AutoTokenizer``)."""
        from transformers import AutoTokenizer

        tokenizer: Any = AutoTokenizer.from_pretrained(str(folder))
        return cls(
            count=lambda text: len(tokenizer(text, verbose=False)["input_ids"]),
            decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
            encode=lambda text: list(
                tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]),
            seed=seed,
        )

    def text(self, num_tokens: int, salt: int | str) -> str:
        """Text that encodes to ``num_tokens`` tokens (the nearest the tokenizer allows)."""
        if num_tokens < 1:
            raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
        # NOTE: the salt's hash leads, so prompts differ from their first token on.
        header = f"# {hashlib.blake2b(str(salt).encode(), digest_size=4).hexdigest()} request\n"
        if self._count(header) >= num_tokens:
            header = ""
        body_len = self._body_len.get(num_tokens, num_tokens - self._count(header))
        best_text, best_miss = "", None
        for _ in range(_CALIBRATION_STEPS):
            body_len = max(body_len, 0)
            candidate = header + self._body(body_len)
            miss = self._count(candidate) - num_tokens
            if best_miss is None or (abs(miss), miss) < (abs(best_miss), best_miss):
                best_text, best_miss = candidate, miss
                self._body_len[num_tokens] = body_len
            if miss == 0 or (miss > 0 and body_len == 0):
                break
            body_len -= miss
        return best_text

    def _body(self, num_ids: int) -> str:
        self._grow(num_ids)
        return self._decode(self._body_ids[:num_ids])

    def _grow(self, num_ids: int) -> None:
        while len(self._body_ids) < num_ids:
            words = [self._rng.choice(_WORDS) for _ in range(max(256, num_ids))]
            lines = [" ".join(words[i:i + 12]) for i in range(0, len(words), 12)]
            self._body_ids.extend(self._encode("\n".join(lines) + "\n"))
