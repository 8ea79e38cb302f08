"""Tool calls read out of a stream of text deltas, by the same rules as `parse_calls`.

While no trigger can be in the text, the text goes out as content; a tail that may
begin a trigger is held back until the next delta tells. From the trigger on, nothing
goes out as content until the end: each call goes out once its JSON (and closing text) is
complete, and at the end the text after the calls is content, or, when the first call
was malformed, all of the held text is.

NOTE: the call section is re-read from its start at every delta; outputs are short, and
it keeps one reader for whole and streamed text.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.tools.formats import CallFormat
from gateway.tools.parse import FoundCall, find_start, safe_end, scan_calls, unblank


@dataclass(frozen=True, slots=True)
class Step:
    """What a delta releases: content text, then calls."""

    content: str
    calls: tuple[FoundCall, ...] = ()


class CallStream:
    """One choice's text, fed delta by delta."""

    def __init__(self, fmt: CallFormat) -> None:
        self.fmt = fmt
        self.text = ""
        self.sent = 0  # chars of `text` sent as content
        self.start: int | None = None  # where the calls begin
        self.num_calls = 0  # calls sent

    def feed(self, text: str) -> Step:
        self.text += text
        if self.start is None:
            self.start = find_start(self.fmt, self.text)
            if self.start is None:
                return Step(self._content_to(safe_end(self.fmt, self.text)))
        content = self._content_to(self.start) if self.text[:self.start].strip() else ""
        self.sent = max(self.sent, self.start)
        return Step(content, self._new_calls(scan_calls(self.fmt, self.text, self.start,
                                                        final=False).calls))

    def finish(self) -> Step:
        """What is left once the output has ended."""
        if self.start is None:
            return Step(self._content_to(len(self.text)))
        scan = scan_calls(self.fmt, self.text, self.start, final=True)
        if not scan.calls:
            return Step(self._content_to(len(self.text)))
        return Step(unblank(self.text[scan.end:]), self._new_calls(scan.calls))

    def _content_to(self, end: int) -> str:
        out = self.text[self.sent:end]
        self.sent = max(self.sent, end)
        return out

    def _new_calls(self, calls: tuple[FoundCall, ...]) -> tuple[FoundCall, ...]:
        new = calls[self.num_calls:]
        self.num_calls = len(calls)
        return new
