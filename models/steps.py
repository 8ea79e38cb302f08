"""`startup_step`: one log line when a long start-up step begins, one when it ends.

A first start is quiet for tens of seconds (kernels measured, operators profiled)
unless each step says so. Each step logs ``WHAT (DETAIL) ...`` when it begins and ``WHAT:
done in N.N s[; RESULT]`` when it ends (or ``WHAT: failed after N.N s`` at WARNING),
on the logger of the module that runs it, so an operator sees what the server is
doing and what each step cost. Steps may nest (a model load measures its kernels).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(slots=True)
class Step:
    """A running step; set `result` to end its last line with what it found."""

    what: str
    result: str = ""


@contextmanager
def startup_step(logger: logging.Logger, what: str, detail: str = "") -> Iterator[Step]:
    """Log `what` (and `detail`) as it begins and, with its duration (and `Step.result`),
    as it ends."""
    step = Step(what)
    logger.info("%s%s ...", what, f" ({detail})" if detail else "")
    t0 = time.perf_counter()
    try:
        yield step
    except BaseException:
        logger.warning("%s: failed after %.1f s", what, time.perf_counter() - t0)
        raise
    logger.info("%s: done in %.1f s%s", what, time.perf_counter() - t0,
                f"; {step.result}" if step.result else "")
