"""gateway.generation.merge: the deltas of a request's choices, and closing them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import cast

import pytest
from transformers import PreTrainedTokenizerBase

from executors.types import Priority
from gateway.engine import Engine
from gateway.generation import Generation, merge
from models.sampling_params import SamplingParams
from scheduler.api import Request, TokenEvent

pytestmark = pytest.mark.asyncio(loop_scope="session")


class Streams:
    """A scheduler whose requests stream one token, then wait until closed; it records what
    ended them."""

    def __init__(self, token: int) -> None:
        self.token = token
        self.closed: list[str] = []
        self.aborted: list[tuple[str, str]] = []

    def submit(self, request: Request) -> AsyncIterator[TokenEvent]:
        return self._stream(request.request_id)

    async def _stream(self, rid: str) -> AsyncIterator[TokenEvent]:
        try:
            yield TokenEvent(self.token, 0, time.monotonic())
            await asyncio.Event().wait()
        finally:
            self.closed.append(rid)

    def abort(self, request_id: str, reason: str) -> None:
        self.aborted.append((request_id, reason))


def _generations(tokenizer: PreTrainedTokenizerBase, streams: Streams,
                 n: int) -> list[Generation]:
    engine = cast(Engine, SimpleNamespace(scheduler=streams, tokenizer=tokenizer))
    out = []
    for i in range(n):
        request = Request(f"r{i}", "t", Priority.HIGH, [1, 2, 3],
                          SamplingParams(temperature=0.0, max_tokens=1000))
        out.append(Generation(i, request, engine, ()))
        out[-1].submit()
    return out


@pytest.mark.parametrize("n", [1, 2])
async def test_closing_the_deltas_ends_every_choice_s_stream_and_aborts_it(
        tokenizer: PreTrainedTokenizerBase, word_ids: tuple[int, ...], n: int) -> None:
    streams = Streams(word_ids[0])
    generations = _generations(tokenizer, streams, n)
    deltas = merge(generations)
    first = await anext(deltas)
    assert first.text and first.finish_reason is None
    await deltas.aclose()
    if n == 1:  # NOTE: read directly, its stream is closed at once, not by the collector
        assert streams.closed == ["r0"]
    assert sorted(streams.aborted) == [(f"r{i}", "abort") for i in range(n)]
    assert all(g.finish_reason == "abort" for g in generations)
