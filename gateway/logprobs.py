"""Log-probabilities in OpenAI's shapes: chat's `content` list and completions' four lists.

A token shows as the text of that single id (`tokenizer.decode([id])`, OpenAI's "text of
the token") and its UTF-8 `bytes`: the byte-level BPE piece's own bytes, so a piece that
holds part of a character keeps its bytes though its text is U+FFFD.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase

from models.logprobs import TokenLogprobs

FLOOR = -9999.0  # what -inf shows as (JSON has no infinity), as vLLM and OpenAI send it
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte fallback

Scored = tuple[int, TokenLogprobs | None]  # a token id, its log-probs (None: the first prompt
# token, which nothing predicts)


def _byte_of_char() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet, char -> the byte it stands for."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    extra = [b for b in range(256) if b not in printable]
    chars = printable + [256 + i for i in range(len(extra))]
    return {chr(c): b for b, c in zip(printable + extra, chars, strict=True)}


class TokenPieces:
    """Each token id's text and bytes (cached: a vocabulary's pieces repeat)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self._tokenizer = tokenizer
        self._byte_of = _byte_of_char()
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def text(self, token_id: int) -> str:
        return self._of(token_id)[0]

    def bytes(self, token_id: int) -> list[int]:
        return self._of(token_id)[1]

    def _of(self, token_id: int) -> tuple[str, list[int]]:
        hit = self._cache.get(token_id)
        if hit is None:
            text = str(self._tokenizer.decode([token_id], skip_special_tokens=False,
                                              clean_up_tokenization_spaces=False))
            hit = self._cache[token_id] = (text, self._raw_bytes(token_id, text))
        return hit

    def _raw_bytes(self, token_id: int, text: str) -> list[int]:
        piece = self._tokenizer.convert_ids_to_tokens(token_id)
        if isinstance(piece, str) and piece:
            if (m := _BYTE_PIECE.fullmatch(piece)) is not None:
                return [int(m.group(1), 16)]
            if all(c in self._byte_of for c in piece):
                return [self._byte_of[c] for c in piece]
        return list(text.encode("utf-8"))


def _lp(value: float) -> float:
    return max(value, FLOOR)


def chat_logprobs(scored: Sequence[Scored], pieces: TokenPieces) -> dict[str, Any]:
    """Chat's `logprobs`: {"content": [{token, logprob, bytes, top_logprobs}]}."""
    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        return {"token": pieces.text(token_id), "logprob": _lp(logprob),
                "bytes": pieces.bytes(token_id)}

    content = []
    for token_id, lp in scored:
        if lp is None:
            continue
        top = [entry(t, v) for t, v in zip(lp.top_ids, lp.top_logprobs, strict=True)]
        content.append({**entry(token_id, lp.logprob), "top_logprobs": top})
    return {"content": content}


def completion_logprobs(scored: Sequence[Scored], pieces: TokenPieces,
                        text_offset: int = 0) -> dict[str, Any]:
    """Completions' `logprobs`: tokens, token_logprobs, top_logprobs and text_offset (the
    characters before each token in the choice's text, from `text_offset`).

    NOTE: each `top_logprobs` dict holds the top alternatives and the chosen token, as vLLM
    sends them (so up to N + 1 entries); the first prompt token's are null."""
    tokens: list[str] = []
    logprobs: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []
    for token_id, lp in scored:
        text = pieces.text(token_id)
        tokens.append(text)
        offsets.append(text_offset)
        text_offset += len(text)
        if lp is None:
            logprobs.append(None)
            tops.append(None)
            continue
        logprobs.append(_lp(lp.logprob))
        top = {pieces.text(t): _lp(v) for t, v in zip(lp.top_ids, lp.top_logprobs, strict=True)}
        top.setdefault(text, _lp(lp.logprob))
        tops.append(top)
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops,
            "text_offset": offsets}
