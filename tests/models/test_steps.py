"""`startup_step`: a line as a long start-up step begins and one, with its duration, as it ends."""

from __future__ import annotations

import logging
import re

import pytest

from models.steps import startup_step

logger = logging.getLogger("models.test")


def test_a_step_logs_its_beginning_and_its_end_with_duration_and_result(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, "models.test"), \
            startup_step(logger, "measuring kernels", "cached in /x") as step:
        step.result = "GEMM onednn"
    begin, end = (r.getMessage() for r in caplog.records)
    assert begin == "measuring kernels (cached in /x) ..."
    assert re.fullmatch(r"measuring kernels: done in \d+\.\d s; GEMM onednn", end), end


def test_a_failed_step_says_so_and_the_error_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, "models.test"), pytest.raises(OSError), \
            startup_step(logger, "compiling"):
        raise OSError("no compiler")
    assert [r.levelname for r in caplog.records] == ["INFO", "WARNING"]
    assert re.fullmatch(r"compiling: failed after \d+\.\d s", caplog.records[1].getMessage())
