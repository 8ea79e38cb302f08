"""Device lists: one parser for the gateway's config and the benches."""

from __future__ import annotations

import pytest

from scheduler.factory import default_devices, device_names, parse_devices


def test_names_from_a_string_or_a_list() -> None:
    assert device_names(" cpu:0, cpu:1 ,") == ["cpu:0", "cpu:1"]
    assert device_names(["cuda:1", "cpu:0"]) == ["cuda:1", "cpu:0"]
    assert device_names(None) == default_devices()


@pytest.mark.parametrize(("spec", "problem"), [
    ("", "at least one device"),
    ([], "at least one device"),
    ("gpu:0", "'gpu:0' is not cuda:N or cpu:N"),
    ("cpu", "is not cuda:N"),
    ("cpu:0,cpu:0", "listed twice"),
])
def test_bad_lists_are_refused(spec: str | list[str], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        device_names(spec)


def test_each_device_gets_the_budget() -> None:
    devices = parse_devices("cpu:0,cpu:1", 1.5)
    assert [(d.name, d.memory_bytes) for d in devices] == [
        ("cpu:0", 3 * 2**29), ("cpu:1", 3 * 2**29)]
