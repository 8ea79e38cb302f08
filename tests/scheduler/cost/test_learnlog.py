"""LearningLog: routine learning noted, one INFO summary a period at most, supervised."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import pytest

from scheduler.cost.learnlog import LearningLog


def test_a_summary_names_what_changed_how_often_and_the_latest_value() -> None:
    refits = [10]
    log = LearningLog(period_s=60)
    log.count("estimator refits", lambda: refits[0])
    assert log.summary() is None  # nothing learnt yet
    refits[0] = 42
    log.note("co-location slowdowns", "layers|layers 1.000->1.120")
    log.note("co-location slowdowns", "layers|layers 1.120->1.250")
    assert log.summary() == ("learnt in the last 60 s: estimator refits 32; co-location "
                             "slowdowns 2 change(s), latest layers|layers 1.120->1.250")
    assert log.summary() is None  # each change is summarised once


def test_a_counter_that_restarts_counts_nothing() -> None:
    total = [5]
    log = LearningLog()
    log.count("estimator refits", lambda: total[0])
    total[0] = 1  # a re-profile replaced the estimators
    assert log.summary() is None
    total[0] = 4
    assert log.summary() == "learnt in the last 60 s: estimator refits 3"


async def until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


async def test_at_most_one_info_line_a_period_and_a_failure_does_not_end_it(
        caplog: pytest.LogCaptureFixture) -> None:
    log = LearningLog(period_s=0.05)
    broken = [False]

    def total() -> int:
        if broken[0]:
            raise RuntimeError("counter gone")
        return 0

    log.count("estimator refits", total)
    caplog.set_level(logging.INFO, logger="scheduler.cost.learnlog")
    task = asyncio.create_task(log.run())
    for i in range(20):  # 20 changes within one period
        log.note("first-token calibration", f"split plans {1 + i / 100:.2f}x")
    await until(lambda: log.summaries == 1)
    broken[0] = True
    await until(lambda: log.failures >= 1)
    broken[0] = False
    log.note("first-token calibration", "split plans 2.00x")
    await until(lambda: log.summaries == 2)
    await asyncio.sleep(0.12)  # two more periods with nothing learnt
    assert not task.done()  # the failure was logged, the summaries go on
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    infos = [r.getMessage() for r in caplog.records if r.levelname == "INFO"]
    assert infos[0].endswith("first-token calibration 20 change(s), latest split plans 1.19x")
    assert infos[-1].endswith("first-token calibration 1 change(s), latest split plans 2.00x")
    assert len(infos) == log.summaries == 2  # nothing to say: no line
    start = [r.created for r in caplog.records if r.levelname == "INFO"]
    assert start[1] - start[0] >= 2 * log.period_s * 0.9  # a failed period between them
    assert log.failures >= 1
    assert any(r.levelname == "ERROR" and r.exc_info for r in caplog.records)
