"""gateway.disconnect: work raced against the client going away, in the caller's task."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.disconnect import unless_disconnected


class Client:
    """An ASGI `receive` whose client disconnects when told to."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()
        self.calls = 0

    async def receive(self) -> dict[str, Any]:
        self.calls += 1
        await self.gone.wait()
        return {"type": "http.disconnect"}


async def test_the_work_s_result_comes_back_in_the_caller_s_task() -> None:
    client = Client()
    caller = asyncio.current_task()

    async def work() -> str:
        assert asyncio.current_task() is caller  # NOTE: no task of its own
        await asyncio.sleep(0.01)
        return "done"

    assert await unless_disconnected(work(), client.receive) == (True, "done")
    await asyncio.sleep(0)
    assert len(asyncio.all_tasks()) == 1  # the watcher is gone with it


async def test_a_disconnect_cancels_the_work_and_leaves_the_caller_running() -> None:
    client = Client()
    unwound = asyncio.Event()

    async def work() -> str:
        try:
            await asyncio.sleep(30)
        finally:
            unwound.set()
        return "never"

    asyncio.get_running_loop().call_later(0.01, client.gone.set)
    assert await unless_disconnected(work(), client.receive) == (False, None)
    assert unwound.is_set()
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    await asyncio.sleep(0.001)  # NOTE: still cancellable from outside, and not cancelled


async def test_the_work_s_error_propagates() -> None:
    async def work() -> None:
        await asyncio.sleep(0)
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        await unless_disconnected(work(), Client().receive)


async def test_a_cancellation_from_elsewhere_is_not_taken_for_a_disconnect() -> None:
    started = asyncio.Event()

    async def work() -> None:
        started.set()
        await asyncio.sleep(30)

    task = asyncio.ensure_future(unless_disconnected(work(), Client().receive))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

