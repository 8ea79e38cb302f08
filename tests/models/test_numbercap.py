"""models.numbercap: the run of a JSON number is counted outside strings only, and at the cap
the number-extending tokens are banned unless nothing would be left."""

from __future__ import annotations

import torch

from models.numbercap import MAX_NUMBER_CHARS, NumberRun, capped, number_continuing


def _run(text: str) -> NumberRun:
    run = NumberRun()
    run.feed(text.encode())
    return run


def test_a_number_outside_strings_is_counted() -> None:
    assert _run('{"a": -12.5e+3').run == len("-12.5e+3")
    assert _run('{"a": 12, "b": 7').run == 1
    assert _run('{"a": true').run == 0  # the e of true starts nothing
    assert _run('{"a": [1, 2]').run == 0


def test_digits_inside_strings_and_escapes_are_not_numbers() -> None:
    assert _run('{"a": "12345').run == 0
    assert _run('{"a": "x\\"1').run == 0 and _run('{"a": "x\\"1').in_string
    assert _run('{"a": "x\\\\"').in_string is False
    assert _run('{"a": "1", "b": 9').run == 1


def test_the_cap_is_reached_at_max_number_chars() -> None:
    assert not _run("1" * (MAX_NUMBER_CHARS - 1)).at_cap
    assert _run("1" * MAX_NUMBER_CHARS).at_cap


def test_capped_bans_continuations_unless_none_would_be_left() -> None:
    continuing = number_continuing([b"1", b"23", b",", b"}", b"", b".5", b" 1"])
    assert continuing.tolist() == [True, True, False, False, False, True, False]
    banned = torch.tensor([False, False, False, True, True, False, True])
    assert capped(banned, continuing).tolist() == [True, True, False, True, True, True, True]
    only_digits = torch.tensor([False, False, True, True, True, True, True])
    assert capped(only_digits, continuing).tolist() == only_digits.tolist()
