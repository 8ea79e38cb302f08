"""`python -m loadgen` itself: help text that reads as plain text on a terminal."""

from __future__ import annotations

import pytest

from loadgen.__main__ import main


@pytest.mark.parametrize("argv", [["--help"], ["replay", "--help"], ["bench", "--help"],
                                  ["stub", "--help"]])
def test_help_has_no_rest_markup(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m loadgen") and "``" not in out
