"""Incremental detokenization and the stop-string matcher."""

from __future__ import annotations

import random

import pytest
from transformers import PreTrainedTokenizerBase

from gateway.detokenize import IncrementalDetokenizer, StopMatcher

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_incremental_equals_full_decode(tokenizer: PreTrainedTokenizerBase) -> None:
    prompt = tokenizer.encode("Say something:")
    text = "The capital of France is Paris. 日本 café — ok! def f(x): return x"
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, prompt)
    out = "".join(detok.push(t) for t in ids) + detok.flush()
    assert out == tokenizer.decode(ids)


async def test_random_ids_match(tokenizer: PreTrainedTokenizerBase) -> None:
    rng = random.Random(0)
    special = set(tokenizer.all_special_ids)
    ids = [t for t in (rng.randrange(len(tokenizer)) for _ in range(300)) if t not in special]
    detok = IncrementalDetokenizer(tokenizer, [])
    out = "".join(detok.push(t) for t in ids) + detok.flush()
    assert out == tokenizer.decode(ids)


def _run(stops: tuple[str, ...], pieces: list[str]) -> tuple[list[str], bool]:
    matcher = StopMatcher(stops)
    emitted = [matcher.feed(p) for p in pieces]
    if not matcher.stopped:
        emitted.append(matcher.flush())
    return emitted, matcher.stopped


async def test_stop_split_across_pieces_is_held_back() -> None:
    emitted, stopped = _run(("STOP",), ["abc S", "T", "O", "P tail"])
    assert stopped and "".join(emitted) == "abc "
    assert emitted[:3] == ["abc ", "", ""]


async def test_false_start_is_released() -> None:
    emitted, stopped = _run(("STOP",), ["ab ST", "x", "yz"])
    assert not stopped and "".join(emitted) == "ab STxyz"
    assert emitted[1] == "STx"


async def test_earliest_of_several_stops_and_overlaps() -> None:
    assert _run(("cd", "b"), ["abcd"]) == (["a"], True)
    assert "".join(_run(("aab",), ["a", "a", "a", "b"])[0]) == "a"
    assert _run((), ["x", "y"]) == (["x", "y", ""], False)


async def test_match_disabled_before_min_tokens() -> None:
    matcher = StopMatcher(("x",))
    assert matcher.feed("axb", match=False) == "axb"
    assert matcher.feed("cx", match=True) == "c" and matcher.stopped
