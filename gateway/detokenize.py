"""Incremental detokenization and stop strings matched on the detokenized text."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

_CONTEXT_TOKENS = 5  # prompt tokens decoded as left context (word boundaries, spaces)
_INCOMPLETE = "\ufffd"  # a multi-byte character whose bytes are not all here yet


class IncrementalDetokenizer:
    """Token ids in, new text out, one token at a time (as vLLM does).

    Decodes a short window `[prefix_offset:]` of the ids and emits the text
    beyond the window's already-emitted part `[prefix_offset:read_offset]`;
    text ending in an incomplete UTF-8 character is held until it completes.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, prompt_ids: list[int]) -> None:
        self._tokenizer = tokenizer
        self._ids = list(prompt_ids[-_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)

    def _decode(self, ids: list[int]) -> str:
        return str(self._tokenizer.decode(ids, skip_special_tokens=True,
                                          clean_up_tokenization_spaces=False))

    def push(self, token_id: int) -> str:
        """Add one generated token; returns the text it completes (maybe empty)."""
        self._ids.append(token_id)
        return self._advance(final=False)

    def flush(self) -> str:
        """The text still held back (an incomplete character) at the end of generation."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        prefix = self._decode(self._ids[self._prefix_offset:self._read_offset])
        full = self._decode(self._ids[self._prefix_offset:])
        if len(full) <= len(prefix) or (full.endswith(_INCOMPLETE) and not final):
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return full[len(prefix):]


class StopMatcher:
    """Finds stop strings in streamed text without ever emitting (part of) one.

    `feed` returns the text that is safe to emit: everything before a stop
    string, minus the longest tail that could still grow into one.
    """

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._pending = ""
        self.stopped = False

    def feed(self, text: str, match: bool = True) -> str:
        """Add text; returns what may be emitted now. Sets `stopped` at a stop string.

        With `match` False (before min_tokens) nothing is matched or held back.
        """
        if self.stopped:
            return ""
        pending = self._pending + text
        if not match:
            self._pending = ""
            return pending
        hits = [i for i in (pending.find(s) for s in self._stops) if i >= 0]
        if hits:
            self.stopped = True
            self._pending = ""
            return pending[:min(hits)]
        keep = self._partial_suffix(pending)
        self._pending = pending[len(pending) - keep:] if keep else ""
        return pending[:len(pending) - keep]

    def flush(self) -> str:
        """At the end of generation: the held-back tail (it never completed a stop string)."""
        out, self._pending = self._pending, ""
        return "" if self.stopped else out

    def _partial_suffix(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
        best = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:n]):
                    best = n
                    break
        return best
