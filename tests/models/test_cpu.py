"""models.cpu: a thread's intra-op thread count, and measurements on a thread of their own."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from models.cpu import in_own_thread, keep_threads

TASKS = Path("/proc/self/task")


def _in_thread(fn: Callable[[], None]) -> None:
    """Run `fn` on a fresh thread (the test process's own threads keep their counts)."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as e:  # NOTE: re-raised in the test's thread
            failed.append(e)
    t = threading.Thread(target=run)
    t.start()
    t.join()
    if failed:
        raise failed[0]


def test_in_own_thread_returns_from_another_thread_at_its_count() -> None:
    def check() -> None:
        keep_threads(1)
        here = threading.get_ident()
        ident, count = in_own_thread(2, lambda: (threading.get_ident(), torch.get_num_threads()))
        assert ident != here and count == 2
        assert torch.get_num_threads() == 1  # the caller's count stays its own
    _in_thread(check)


def test_in_own_thread_raises_what_the_function_raised() -> None:
    def boom() -> None:
        raise KeyError("measured nothing")
    with pytest.raises(KeyError, match="measured nothing"):
        in_own_thread(2, boom)


def test_keep_threads_holds_against_another_threads_setting() -> None:
    def check() -> None:
        keep_threads(1)
        other = threading.Thread(target=lambda: torch.set_num_threads(2))
        other.start()
        other.join()
        assert torch.get_num_threads() == 1
    _in_thread(check)


@pytest.mark.skipif(not TASKS.is_dir() or (os.cpu_count() or 1) < 2,
                    reason="needs Linux's /proc and two cores")
def test_in_own_thread_leaves_no_openmp_team_behind() -> None:
    def check() -> None:
        keep_threads(1)
        before = len(list(TASKS.iterdir()))
        x = torch.randn(512, 512)
        inside = in_own_thread(2, lambda: ((x @ x).sum(), len(list(TASKS.iterdir())))[1])
        assert inside > before  # the team's worker ran beside the measuring thread
        deadline = time.monotonic() + 5
        while len(list(TASKS.iterdir())) > before and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(list(TASKS.iterdir())) <= before
    _in_thread(check)
