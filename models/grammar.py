"""Structured output: a request's grammar as a per-step token mask (llguidance).

A `GrammarSpec` (JSON schema, any JSON object, regex, choice, or a Lark / GBNF
grammar) is compiled once per distinct spec for the model's tokenizer
(`Grammars`, a small LRU); each constrained request gets its own `Constraint`,
whose matcher advances with every accepted token and says when the grammar is
complete.

NOTE: llguidance was chosen by measurement (`python -m benchmarks.models grammar`,
docs/benchmarks/structured-output.md): a schema is ready in about a millisecond
(it parses lazily, so there is nothing slow to move off the event loop), a mask
costs ~0.1 ms against a ~30 ms decode step, and it takes every form vLLM takes
(JSON schema, regex, choice, Lark and GBNF grammars) with a readable error.

The next step's mask is computed on a worker thread right after a token is
accepted (llguidance drops the GIL), so it is ready while the operator chain
runs; the sampler waits for it only if it is not. Pickled (to a Ray actor), a
constraint travels as the mask of its current step, which is all a sampler reads.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from threading import Lock
from typing import TYPE_CHECKING, Any

import llguidance
import llguidance.hf
import torch

from models.numbercap import NumberRun, capped, number_continuing

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions  # a TypedDict of the stubs only

logger = logging.getLogger(__name__)

KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")
JSON_KINDS = ("json_schema", "json_object")  # their numbers are capped (models/numbercap.py)
ANY_JSON_OBJECT = {"type": "object"}  # response_format {"type": "json_object"}
# NOTE: ", " and ": " as Python's json.dumps writes them, the layout models saw most;
# no free whitespace, so a model cannot pad an object with newlines until max_tokens
JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False, "item_separator": ", ",
                                    "key_separator": ": "}


class GrammarError(ValueError):
    """A spec the engine cannot compile; the message is the engine's."""


@dataclass(frozen=True, slots=True)
class GrammarSpec:
    """What a request's output must match: `kind` in KINDS and its text in a canonical
    form (a schema as JSON with sorted keys, choices as a JSON array), so equal specs
    share one compile."""

    kind: str
    text: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"grammar kind must be one of {KINDS}, got {self.kind!r}")

    @classmethod
    def json_schema(cls, schema: object) -> GrammarSpec:
        return cls("json_schema", json.dumps(schema, sort_keys=True))

    @classmethod
    def choice(cls, choices: list[str]) -> GrammarSpec:
        return cls("choice", json.dumps(choices))


def _grammar(spec: GrammarSpec) -> str:
    """The llguidance grammar of `spec` (raises ValueError on a bad one)."""
    if spec.kind == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema(ANY_JSON_OBJECT,
                                                             defaults=JSON_OPTIONS)
    if spec.kind == "json_schema":
        return llguidance.LLMatcher.grammar_from_json_schema(spec.text, defaults=JSON_OPTIONS)
    if spec.kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(spec.text)
    return llguidance.grammar_from("choice" if spec.kind == "choice" else "grammar", spec.text)


class Grammars:
    """Compiles specs for one tokenizer, keeping the last `cache_size` compiled (or refused)
    ones; hands out a fresh `Constraint` per request. Thread-safe."""

    def __init__(self, tokenizer: Any, vocab_size: int, cache_size: int = 256) -> None:
        self.vocab_size = vocab_size
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)
        self.cache_size = cache_size
        self._cache: OrderedDict[GrammarSpec, str | GrammarError] = OrderedDict()
        self._lock = Lock()
        self._token_bytes: list[bytes] | None = None  # built by the first JSON constraint
        self._continuing: torch.Tensor | None = None  # [V] bool
        # NOTE: one thread: a mask costs ~0.1 ms, and rows are filled in token order
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-mask")

    def compile(self, spec: GrammarSpec) -> str:
        """The checked grammar of `spec`; GrammarError with the engine's message if none."""
        with self._lock:
            got = self._cache.get(spec)
            if got is not None:
                self._cache.move_to_end(spec)
        if got is None:
            got = self._compile(spec)
            with self._lock:
                self._cache[spec] = got
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        if isinstance(got, GrammarError):
            raise got
        return got

    def _compile(self, spec: GrammarSpec) -> str | GrammarError:
        try:
            grammar = _grammar(spec)
        except (ValueError, TypeError, RuntimeError) as exc:
            return GrammarError(str(exc))
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
            grammar, self.tokenizer)
        if is_error:
            return GrammarError(messages[0])
        return grammar

    def constraint(self, spec: GrammarSpec) -> Constraint:
        """A new matcher at the start of `spec`'s grammar (GrammarError if it has none)."""
        matcher = llguidance.LLMatcher(self.tokenizer, self.compile(spec))
        if matcher.is_error():
            raise GrammarError(matcher.get_error())
        cap = self._number_cap() if spec.kind in JSON_KINDS else None
        return Constraint(matcher, self.vocab_size, self._pool, cap)

    def _number_cap(self) -> NumberCap:
        with self._lock:
            if self._token_bytes is None or self._continuing is None:
                n = self.tokenizer.vocab_size
                self._token_bytes = [self.tokenizer.decode_bytes([t]) for t in range(n)]
                self._token_bytes += [b""] * (self.vocab_size - n)
                self._continuing = number_continuing(self._token_bytes)
            return NumberCap(self._token_bytes, self._continuing)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


@dataclass(slots=True)
class NumberCap:
    """A JSON constraint's number cap: each token's bytes, the tokens that extend a number,
    and where the output stands."""

    token_bytes: list[bytes]
    continuing: torch.Tensor  # [V] bool
    run: NumberRun = field(default_factory=NumberRun)

    def advance(self, token: int) -> None:
        if 0 <= token < len(self.token_bytes):
            self.run.feed(self.token_bytes[token])

    def apply(self, banned: torch.Tensor) -> torch.Tensor:
        return capped(banned, self.continuing) if self.run.at_cap else banned


class Constraint:
    """One request's grammar state: `banned()` is the next token's mask, `advance(token)`
    takes a sampled token, `is_complete` is True once the grammar ended (or refused)."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int,
                 pool: ThreadPoolExecutor, cap: NumberCap | None = None) -> None:
        self._matcher, self._vocab, self._pool, self._cap = matcher, vocab_size, pool, cap
        self._complete = False
        self._next: Future[torch.Tensor] = pool.submit(self._mask)

    def _mask(self) -> torch.Tensor:
        bitmask = torch.empty(1, (self._vocab + 31) // 32, dtype=torch.int32)  # [1, W]
        # NOTE: what llguidance.torch's fill does, without importing that module (it
        # runs torch.compile at import)
        self._matcher.unsafe_compute_mask_ptr(bitmask.data_ptr(), bitmask.numel() * 4)
        banned = banned_tokens(bitmask[0], self._vocab)  # [V] bool
        return banned if self._cap is None else self._cap.apply(banned)

    def banned(self) -> torch.Tensor:
        """[V] bool: True for the tokens the grammar forbids next."""
        return self._next.result()

    def advance(self, token: int) -> None:
        """Accept `token` and start computing the next step's mask."""
        self._next.result()  # NOTE: the matcher is not thread-safe: let the fill finish
        if not self._matcher.consume_token(token):
            logger.warning("grammar refused token %d: %s", token, self._matcher.get_error())
        if self._cap is not None:
            self._cap.advance(token)
        self._complete = bool(self._matcher.is_stopped())
        self._next = self._pool.submit(self._mask)

    @property
    def is_complete(self) -> bool:
        return self._complete

    def __reduce__(self) -> tuple[type[StepMask], tuple[torch.Tensor]]:
        return StepMask, (self.banned(),)


@dataclass(frozen=True, slots=True)
class StepMask:
    """A constraint as a remote sampler sees it: the mask of one step."""

    mask: torch.Tensor  # [V] bool, True = forbidden

    def banned(self) -> torch.Tensor:
        return self.mask


def banned_tokens(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The forbidden tokens of an allowed-token bitmask (bit t % 32 of word t // 32)."""
    # bitmask: [W] int32 -> [V] bool
    bits = torch.arange(32, dtype=torch.int32)  # [32]
    allowed = (bitmask[:, None] >> bits) & 1  # [W, 32]
    return allowed.flatten()[:vocab_size] == 0  # [V]
