"""The three grammar engines the structured-output bench compares, behind one small face.

Each compiles a JSON schema for a tokenizer's vocabulary and gives a matcher that
fills a next-token bitmask (int32 words, bit `t % 32` of word `t // 32` set when
token `t` is allowed: the layout all three share), accepts a token and says when
the grammar is complete. Only the bench imports the losers; the server uses
`models.grammar`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Protocol

import torch


class Matcher(Protocol):
    def fill(self, bitmask: torch.Tensor) -> None: ...  # bitmask: [1, ceil(V / 32)] int32
    def accept(self, token: int) -> bool: ...
    def done(self) -> bool: ...


class Engine(Protocol):
    name: str
    version: str

    def compile(self, schema: dict[str, Any]) -> object: ...
    def matcher(self, compiled: object) -> Matcher: ...


class XGrammar:
    name = "xgrammar"

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        import xgrammar as xgr
        # NOTE: Any, so mypy reads this the same with the optional extra installed or not
        self.xgr: Any = xgr
        self.version = _dist_version("xgrammar")
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self.compiler = xgr.GrammarCompiler(info, cache_enabled=False)

    def compile(self, schema: dict[str, Any]) -> object:
        return self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)

    def matcher(self, compiled: object) -> Matcher:
        return _XgrMatcher(self.xgr.GrammarMatcher(compiled))


class _XgrMatcher:
    def __init__(self, m: Any) -> None:
        self.m = m

    def fill(self, bitmask: torch.Tensor) -> None:
        self.m.fill_next_token_bitmask(bitmask)

    def accept(self, token: int) -> bool:
        return bool(self.m.accept_token(token))

    def done(self) -> bool:
        return bool(self.m.is_terminated())


class LLGuidance:
    name = "llguidance"

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        import llguidance
        import llguidance.hf
        import llguidance.torch
        self.ll = llguidance
        self.version = _dist_version("llguidance")
        self.tok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)

    def compile(self, schema: dict[str, Any]) -> object:
        grammar = self.ll.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_flexible": False, "item_separator": ", ",
                             "key_separator": ": "})
        is_error, log = self.ll.LLMatcher.validate_grammar_with_warnings(grammar, self.tok)
        if is_error:
            raise ValueError(log[0])
        return grammar

    def matcher(self, compiled: object) -> Matcher:
        return _LLMatcher(self.ll, self.ll.LLMatcher(self.tok, str(compiled)))


class _LLMatcher:
    def __init__(self, ll: Any, m: Any) -> None:
        self.ll, self.m = ll, m

    def fill(self, bitmask: torch.Tensor) -> None:
        self.ll.torch.fill_next_token_bitmask(self.m, bitmask, 0)

    def accept(self, token: int) -> bool:
        return bool(self.m.consume_token(token))

    def done(self) -> bool:
        return bool(self.m.is_stopped())


class OutlinesCore:
    name = "outlines-core"

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        import outlines_core
        from outlines_core.json_schema import build_regex_from_schema
        from outlines_core.kernels import torch as kernels
        self.oc, self.kernels, self.to_regex = outlines_core, kernels, build_regex_from_schema
        self.version = _dist_version("outlines-core")
        self.vocab = outlines_core.Vocabulary(tokenizer.eos_token_id, _byte_vocab(tokenizer))

    def compile(self, schema: dict[str, Any]) -> object:
        return self.oc.Index(self.to_regex(json.dumps(schema)), self.vocab)

    def matcher(self, compiled: object) -> Matcher:
        return _OcMatcher(self.kernels, self.oc.Guide(compiled), self.vocab.get_eos_token_id())


class _OcMatcher:
    def __init__(self, kernels: Any, guide: Any, eos: int) -> None:
        self.kernels, self.g, self.eos = kernels, guide, eos

    def fill(self, bitmask: torch.Tensor) -> None:
        self.kernels.fill_next_token_bitmask(self.g, bitmask)

    def accept(self, token: int) -> bool:
        if token == self.eos and self.g.is_finished():
            return True
        try:
            self.g.advance(token)
        except ValueError:
            return False
        return True

    def done(self) -> bool:
        return bool(self.g.is_finished())


def _dist_version(name: str) -> str:
    from importlib.metadata import version
    return version(name)


def _byte_vocab(tokenizer: Any) -> dict[bytes, list[int]]:
    """GPT-2 byte-level token strings as the bytes they stand for (special tokens and the
    EOS left out: outlines-core's Vocabulary wants neither)."""
    decode = {c: b for b, c in _bytes_to_unicode().items()}
    special = set(tokenizer.all_special_ids)
    out: dict[bytes, list[int]] = {}
    for text, i in tokenizer.get_vocab().items():
        if i in special:
            continue
        out.setdefault(bytes(decode[c] for c in text), []).append(i)
    return out


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map of each byte to the printable character its vocabulary writes it as."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    out = {b: chr(b) for b in printable}
    n = 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + n)
            n += 1
    return out


ENGINES: dict[str, Callable[[Any, int], Engine]] = {
    "xgrammar": XGrammar, "llguidance": LLGuidance, "outlines-core": OutlinesCore}
