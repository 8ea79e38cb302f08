"""loadgen.probe.TimelinePoller: op spans moved onto this process's clock."""

from __future__ import annotations

import time

import httpx
import pytest

from loadgen.probe import TimelinePoller

AHEAD_S = 5.0  # the server's clock, ahead of ours


def _server(request: httpx.Request) -> httpx.Response:
    now = time.monotonic() + AHEAD_S
    event = {"device": "cpu:0", "op": "embed", "start": now - 0.2, "end": now - 0.1}
    return httpx.Response(200, json={"now": now, "since": 0.0, "events": [event]})


@pytest.mark.parametrize(("same_clock", "shift_s"), [(False, AHEAD_S), (True, 0.0)])
async def test_spans_are_moved_by_the_learnt_offset_unless_the_clock_is_shared(
        same_clock: bool, shift_s: float) -> None:
    async with httpx.AsyncClient(transport=httpx.MockTransport(_server),
                                 base_url="http://server") as client:
        poller = TimelinePoller(client, "sk-admin", 0.0, same_clock=same_clock)
        before = time.monotonic()
        assert await poller.poll_once()
        after = time.monotonic()
    [span] = poller.spans
    # NOTE: the server stamped `now` between our send and receipt; its op ended 0.1 s before
    assert before + AHEAD_S - shift_s - 0.1 - 0.05 <= span.end_s <= after + AHEAD_S - shift_s
