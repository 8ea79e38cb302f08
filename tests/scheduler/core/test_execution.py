"""The executors' share of the cores: one rule for the executors and the kernels chosen for them."""

from __future__ import annotations

import pytest

from scheduler.core.execution import cpu_threads


def test_cpu_devices_split_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    assert [cpu_threads(n) for n in (0, 1, 2, 3, 16)] == [8, 8, 4, 2, 1]
    monkeypatch.setattr("os.cpu_count", lambda: None)
    assert cpu_threads(1) == 1
