"""One choice's generation: a submitted scheduler request turned into text deltas.

`Generation` owns everything that ends a request early — a stop string
(`abort(id, "stop")`), the total deadline (`abort(id, "deadline")`, finishing
with `length`) and the client walking away (`abort(id, "abort")` from `close`)
— so every request ends cleanly with a finish reason and frees its KV blocks.

The choices of one prompt (`n` > 1) share its prefill: the later ones follow the first
(`leader`) and are submitted once its first token came, when the prompt's full blocks are
in the prefix cache; a leader that ends before that ends them with its finish reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, replace

from gateway.detokenize import IncrementalDetokenizer, StopMatcher
from gateway.engine import Engine
from gateway.logprobs import Scored
from scheduler.api import FinishReason, Request, RequestTrace, TokenEvent

_FINISH = {FinishReason.STOP: "stop", FinishReason.LENGTH: "length",
           FinishReason.ABORT: "abort", FinishReason.ERROR: "error"}


@dataclass(frozen=True, slots=True)
class Delta:
    """New text of choice `index`; a choice's last delta carries its `finish_reason`."""

    index: int
    text: str
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    error: str | None = None  # with finish_reason "error"
    # the tokens whose text this delta completes (of those since the last delta), with their
    # log-probs, when the request asked for them; the echoed prompt's tokens first
    logprobs: tuple[Scored, ...] = ()
    text_offset: int = 0  # characters of the choice's text before this delta


class Generation:
    """Choice `index` of an HTTP request: submit, stream deltas, close (aborts if unfinished)."""

    def __init__(self, index: int, request: Request, engine: Engine,
                 stops: tuple[str, ...], echo: str | None = None,
                 leader: Generation | None = None) -> None:
        self.index = index
        self.follows = leader is not None  # submitted by its leader, not by the job
        self._followers: list[Generation] = []  # submitted once this one's prefill is done
        self._submitted = asyncio.Event()  # set on submit, or on close before it
        if leader is not None:
            leader._followers.append(self)
        self.request = request
        self._scheduler = engine.scheduler
        self._detokenizer = IncrementalDetokenizer(engine.tokenizer, request.prompt_token_ids)
        self._matcher = StopMatcher(stops)
        self._events: AsyncIterator[TokenEvent] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._deadline_hit = False
        self.submit_time: float | None = None  # monotonic s
        self.first_token_time: float | None = None  # monotonic s, from the scheduler's event
        self.last_token_time: float | None = None
        self.num_generated = 0
        self.num_cached_tokens = 0  # prompt tokens the scheduler found in its prefix cache
        self.finish_reason: str | None = None
        self.trace: RequestTrace | None = None  # the scheduler's, with a traced request's end
        self._echo = echo  # the prompt's text, sent before the first token's
        self._scored: list[Scored] = []  # log-probs not yet sent
        self._num_chars = 0  # characters sent

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.request.prompt_token_ids)

    def submit(self) -> None:
        """Hand the request to the scheduler (raises RequestTooLarge / Overloaded); a
        generation closed before that stays unsubmitted."""
        if self.finish_reason is not None:
            return
        self._events = self._scheduler.submit(self.request)
        self._submitted.set()
        self.submit_time = time.monotonic()
        if self.request.deadline_s is not None:
            delay = self.request.arrival_time + self.request.deadline_s - self.submit_time
            self._timer = asyncio.get_running_loop().call_later(max(delay, 0.0),
                                                                self._on_deadline)

    def close(self, reason: str = "abort") -> None:
        """Abort the request if it is still running (one never submitted ends with `reason`).
        Idempotent; safe in any `finally`."""
        if self._timer is not None:
            self._timer.cancel()
        if self._events is None and self.finish_reason is None:
            self.finish_reason = reason
            self._submitted.set()
        if self._events is not None and self.finish_reason is None:
            self.finish_reason = "abort"
            self._scheduler.abort(self.request.request_id, "abort")

    async def deltas(self) -> AsyncGenerator[Delta, None]:
        """The choice's text as it is generated; always ends with a finishing delta."""
        if self.follows and self._events is None:
            await self._submitted.wait()
            if self._events is None:  # closed before its leader submitted it
                yield Delta(self.index, "", self.finish_reason or "abort")
                return
        assert self._events is not None, "submit() first"
        try:
            async for event in self._events:
                if self._followers and event.token_id is not None:
                    self._release_followers()
                self._score(event)
                delta = self._attach(self._on_event(event))
                if delta is not None:
                    yield delta
                if self.finish_reason is not None:
                    return
            self.finish_reason = "abort"  # the scheduler ended the stream without a reason
            yield Delta(self.index, self._matcher.flush(), "abort")
        finally:
            self.close()
            for follower in self._followers:  # NOTE: it ended before its prefill was done
                follower.close(self.finish_reason or "abort")
            aclose = getattr(self._events, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()

    def _release_followers(self) -> None:
        """Submit the choices that waited for this one's prefill: its full blocks are cached.
        NOTE: a refusal (Overloaded) ends the request; the followers left are closed."""
        followers, self._followers = self._followers, []
        for follower in followers:
            follower.submit()

    def _score(self, event: TokenEvent) -> None:
        """Keep the event's log-probs (and the echoed prompt's) for the next delta."""
        if event.prompt_logprobs is not None and self._echo is not None:
            ids = self.request.prompt_token_ids
            self._scored += [(t, lp) for t, lp in zip(ids, event.prompt_logprobs, strict=True)]
        ends_on_it = (event.finish_reason is FinishReason.STOP
                      and event.token_id in self.request.sampling.stop_token_ids)
        if event.logprobs is not None and event.token_id is not None and not ends_on_it:
            self._scored.append((event.token_id, event.logprobs))

    def _attach(self, delta: Delta | None) -> Delta | None:
        """The delta with the echoed prompt before its text and the log-probs kept so far."""
        if self._echo is None and (delta is None or not self._scored):
            if delta is not None:
                self._num_chars += len(delta.text)
            return delta  # NOTE: the usual request: no copy of its deltas
        delta = delta or Delta(self.index, "")
        echo, self._echo = self._echo or "", None
        scored, self._scored = tuple(self._scored), []
        delta = replace(delta, text=echo + delta.text, logprobs=scored,
                        text_offset=self._num_chars)
        self._num_chars += len(delta.text)
        return delta

    def _on_deadline(self) -> None:
        if self.finish_reason is None:
            self._deadline_hit = True
            self._scheduler.abort(self.request.request_id, "deadline")

    def _on_event(self, event: TokenEvent) -> Delta | None:
        text = ""
        sampling = self.request.sampling
        self.num_cached_tokens = event.num_cached_tokens
        if event.trace is not None:
            self.trace = event.trace
        if event.token_id is not None:
            self.num_generated += 1
            self.first_token_time = self.first_token_time or event.time
            self.last_token_time = event.time
            ends_on_it = (event.finish_reason is FinishReason.STOP
                          and event.token_id in sampling.stop_token_ids)
            if not ends_on_it:  # NOTE: a stop token's own text is never part of the output
                text = self._detokenizer.push(event.token_id)
        out = self._matcher.feed(text, match=self.num_generated >= sampling.min_tokens)
        if self._matcher.stopped:
            self.finish_reason = "stop"
            self._scheduler.abort(self.request.request_id, "stop")
            return Delta(self.index, out, "stop")
        if event.finish_reason is None:
            return Delta(self.index, out) if out else None
        out += self._matcher.feed(self._detokenizer.flush())
        if self._matcher.stopped:
            self.finish_reason = "stop"
        else:
            out += self._matcher.flush()
            reason = _FINISH[event.finish_reason]
            self.finish_reason = "length" if reason == "abort" and self._deadline_hit else reason
        return Delta(self.index, out, self.finish_reason, event.error)


async def merge(generations: list[Generation]) -> AsyncGenerator[Delta, None]:
    """Deltas of all choices in arrival order; closing this iterator aborts unfinished ones."""
    if len(generations) == 1:
        # NOTE: one choice (the usual request) is read directly: a pump task and a queue
        # between it and the reader cost a task and a turn of the loop per token
        deltas = generations[0].deltas()
        try:
            async for delta in deltas:
                yield delta
        finally:
            await deltas.aclose()  # NOTE: at once; left to the collector it runs a turn later
            generations[0].close()
        return
    queue: asyncio.Queue[Delta | Exception] = asyncio.Queue()

    async def pump(generation: Generation) -> None:
        try:
            async for delta in generation.deltas():
                queue.put_nowait(delta)
        except Exception as exc:  # surfaced to the consumer below
            queue.put_nowait(exc)

    tasks = [asyncio.create_task(pump(g)) for g in generations]
    try:
        remaining = len(generations)
        while remaining:
            item = await queue.get()
            if isinstance(item, Exception):
                raise item
            if item.finish_reason is not None:
                remaining -= 1
            yield item
    finally:
        for task in tasks:
            task.cancel()
        for generation in generations:
            generation.close()
