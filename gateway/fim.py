"""Fill-in-the-middle (`suffix` on /v1/completions): the known FIM token sets, as data, and
finding a model's in its tokenizer's vocabulary.

A FIM prompt is built from token ids in PSM order (prefix, suffix, middle)::

    [BOS, if the tokenizer puts one before plain prompts] + [prefix token] + tok(prefix)
    + [suffix token] + tok(suffix) + [middle token]

and the model writes the middle. `tok(prefix)` is the prefix as a plain prompt is encoded,
without special tokens; `tok(suffix)` also drops the SentencePiece dummy space that
Llama-style tokenizers put before a prompt's first word, as CodeLlama's reference code
(`encode_infilling`) and its transformers tokenizer do.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

AUTO, NONE = "auto", "none"


@dataclass(frozen=True, slots=True)
class FimTokens:
    """Three FIM token strings, spelled as in the vocabulary, in the order they are fed."""

    prefix: str  # before the prefix text (DeepSeek-Coder's "fim begin")
    suffix: str  # before the suffix text (DeepSeek-Coder's "fim hole")
    middle: str  # last; the model writes the middle after it (DeepSeek-Coder's "fim end")

    def __str__(self) -> str:
        return f"{self.prefix} {self.suffix} {self.middle}"


# NOTE: CodeLlama's tokens carry SentencePiece's "▁" in its vocabulary: its documented
# "<PRE> {pre} <SUF>{suf} <MID>" is "▁<PRE>" + "▁" + pre + "▁<SUF>" + suf + "▁<MID>".
KNOWN_FIM: dict[str, FimTokens] = {
    "starcoder": FimTokens("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # and StarCoder2
    "codellama": FimTokens("▁<PRE>", "▁<SUF>", "▁<MID>"),
    "deepseek-coder": FimTokens("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
    "qwen2.5-coder": FimTokens("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
}

FimSetting = str | FimTokens  # AUTO, NONE, a KNOWN_FIM name, or three tokens


def parse_fim_setting(value: Any) -> FimSetting:
    """`model.fim`: auto, none, a known set's name, or its three tokens (a list, a mapping
    with prefix/suffix/middle, or "PREFIX,SUFFIX,MIDDLE"); ValueError otherwise."""
    given = value
    if isinstance(value, FimTokens):
        return value
    if isinstance(value, str):
        if value in (AUTO, NONE, *KNOWN_FIM):
            return value
        value = value.split(",")
    if isinstance(value, Mapping) and set(value) == {"prefix", "suffix", "middle"}:
        value = [value["prefix"], value["suffix"], value["middle"]]
    if isinstance(value, list | tuple) and len(value) == 3 and all(
            isinstance(t, str) and t for t in value):
        return FimTokens(*value)
    raise ValueError(f"{AUTO}, {NONE}, one of {', '.join(KNOWN_FIM)}, or the three tokens "
                     f"(prefix, suffix, middle), got {given!r}")


@dataclass(frozen=True, slots=True)
class Fim:
    """A model's FIM tokens as ids, and how its tokenizer frames a FIM prompt."""

    name: str  # a KNOWN_FIM name, or "config" for tokens given in the config
    tokens: FimTokens
    prefix_id: int
    suffix_id: int
    middle_id: int
    bos_ids: tuple[int, ...]  # what the tokenizer puts before a plain prompt (BOS), if any
    encode_suffix: Callable[[str], list[int]] = field(compare=False, repr=False)

    def prompt(self, prefix_ids: list[int], suffix_ids: list[int]) -> list[int]:
        """The ids fed to the model (see the module docstring)."""
        return [*self.bos_ids, self.prefix_id, *prefix_ids, self.suffix_id, *suffix_ids,
                self.middle_id]


def token_id(tokenizer: PreTrainedTokenizerBase, token: str, vocab_size: int) -> int | None:
    """The id of `token` when it is one token of the vocabulary (below `vocab_size`)."""
    found = tokenizer.convert_tokens_to_ids(token)
    if not isinstance(found, int) or not 0 <= found < vocab_size:
        return None
    return found if tokenizer.convert_ids_to_tokens(found) == token else None


def _ids(tokenizer: PreTrainedTokenizerBase, tokens: FimTokens,
         vocab_size: int) -> tuple[int, int, int] | None:
    p, s, m = (token_id(tokenizer, t, vocab_size)
               for t in (tokens.prefix, tokens.suffix, tokens.middle))
    return None if p is None or s is None or m is None else (p, s, m)


def detect(tokenizer: PreTrainedTokenizerBase, vocab_size: int) -> str | None:
    """The name of the first known FIM set whose three tokens are in the vocabulary."""
    return next((name for name, tokens in KNOWN_FIM.items()
                 if _ids(tokenizer, tokens, vocab_size) is not None), None)


def resolve_fim(tokenizer: PreTrainedTokenizerBase, setting: FimSetting,
                vocab_size: int) -> Fim | None:
    """The model's FIM tokens per `model.fim`; None when it has none or they are turned off.
    ValueError when the config names tokens the vocabulary lacks."""
    if setting == NONE:
        return None
    name = detect(tokenizer, vocab_size) if setting == AUTO else setting
    if name is None:
        return None
    tokens = name if isinstance(name, FimTokens) else KNOWN_FIM[name]
    ids = _ids(tokenizer, tokens, vocab_size)
    if ids is None:
        raise ValueError("model.fim: the tokenizer lacks "
                         f"{_missing(tokenizer, tokens, vocab_size)} "
                         "(each must be one token of the model's vocabulary)")
    return Fim(name if isinstance(name, str) else "config", tokens, *ids,
               bos_ids=_leading_special_ids(tokenizer),
               encode_suffix=_continuation_encoder(tokenizer))


def _missing(tokenizer: PreTrainedTokenizerBase, tokens: FimTokens, vocab_size: int) -> str:
    return ", ".join(t for t in (tokens.prefix, tokens.suffix, tokens.middle)
                     if token_id(tokenizer, t, vocab_size) is None)


def no_fim_message(tokenizer: PreTrainedTokenizerBase, vocab_size: int,
                   model: str) -> str:
    """Why `suffix` is refused for this model: FIM turned off, or which tokens it lacks."""
    head = "Unsupported parameter: 'suffix' is not supported with this model"
    if detect(tokenizer, vocab_size) is not None:
        return (f"{head}: fill-in-the-middle is turned off for {model!r} in the server's "
                "config (model.fim: none).")
    sets = "; ".join(f"{name}: {tokens}" for name, tokens in KNOWN_FIM.items())
    return (f"{head}: {model!r} has no fill-in-the-middle tokens; its vocabulary has none of "
            f"the known sets ({sets}). A server whose model has other FIM tokens names them "
            "in model.fim (--fim PREFIX,SUFFIX,MIDDLE).")


def _leading_special_ids(tokenizer: PreTrainedTokenizerBase) -> tuple[int, ...]:
    """The ids the tokenizer puts before a plain prompt's own (BOS), found on a probe."""
    probe = "a"
    plain = list(tokenizer.encode(probe, add_special_tokens=False))
    full = list(tokenizer.encode(probe, add_special_tokens=True))
    for start in range(len(full) - len(plain) + 1):
        if full[start:start + len(plain)] == plain:
            return tuple(full[:start])
    return ()


def _continuation_encoder(tokenizer: PreTrainedTokenizerBase) -> Callable[[str], list[int]]:
    """Encodes text that continues a prompt: no special tokens, no SentencePiece dummy space.

    NOTE: the dummy space is a `Prepend("▁")` normalizer (older Llama tokenizer.json files)
    or a `Metaspace` pre-tokenizer that prepends; a copy of the backend without them, built
    once, encodes the suffix. Byte-level BPE tokenizers (StarCoder, DeepSeek, Qwen) have
    neither and keep their own backend."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return lambda text: list(tokenizer.encode(text, add_special_tokens=False))
    spec = json.loads(backend.to_str())
    stripped = {**spec, "normalizer": _no_dummy_space(spec.get("normalizer")),
                "pre_tokenizer": _no_dummy_space(spec.get("pre_tokenizer"))}
    if stripped != spec:
        backend = type(backend).from_str(json.dumps(stripped))
    return lambda text: list(backend.encode(text, add_special_tokens=False).ids)


def _no_dummy_space(node: Any) -> Any:
    """A normalizer or pre-tokenizer spec without what prepends "▁" to the text."""
    if isinstance(node, list):
        return [n for n in map(_no_dummy_space, node) if n is not None]
    if not isinstance(node, dict):
        return node
    if node.get("type") == "Prepend" and node.get("prepend") == "▁":
        return None
    out = {key: _no_dummy_space(value) for key, value in node.items()}
    if node.get("type") == "Metaspace":
        out["prepend_scheme"] = "never"
        if "add_prefix_space" in out:
            out["add_prefix_space"] = False
    return out
