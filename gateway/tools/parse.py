"""Tool calls read out of generated text by a `CallFormat`, whole or as it streams.

`scan` walks the call section from where a trigger appeared; a call counts once its JSON
and its closing text are complete. Whatever cannot be read as calls stays text: output
whose first call is malformed is plain content, and text after the last good call (or
after a malformed one) is content too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gateway.tools.formats import CallFormat

_DECODER = json.JSONDecoder()


@dataclass(frozen=True, slots=True)
class FoundCall:
    """A call the model wrote: its function's name and arguments as JSON text."""

    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Scan:
    """The call section as far as it can be read."""

    calls: tuple[FoundCall, ...]  # the complete calls
    end: int  # text offset after the last complete call (and the list's close); the text
    # from there on is content once the output is finished


@dataclass(frozen=True, slots=True)
class Parsed:
    """Generated text split into content and calls."""

    content: str | None  # the text outside the calls; None when blank and calls were made
    calls: tuple[FoundCall, ...]


def parse_calls(fmt: CallFormat, text: str) -> Parsed:
    """The calls in a finished output, and the text around them."""
    start = find_start(fmt, text)
    if start is None:
        return Parsed(text, ())
    scan = scan_calls(fmt, text, start, final=True)
    if not scan.calls:
        return Parsed(text, ())
    content = unblank(text[:start]) + unblank(text[scan.end:])
    return Parsed(content or None, scan.calls)


def unblank(text: str) -> str:
    """Text beside calls is content unless it is only whitespace."""
    return text if text.strip() else ""


def find_start(fmt: CallFormat, text: str) -> int | None:
    """Where the calls begin (a trigger's offset), or None."""
    if fmt.at_start:
        i = len(text) - len(text.lstrip())
        return i if any(text.startswith(t, i) for t in fmt.triggers) else None
    found = [i for i in (text.find(t) for t in fmt.triggers) if i >= 0]
    return min(found) if found else None


def safe_end(fmt: CallFormat, text: str) -> int:
    """With no trigger in `text` yet: how much of it is content whatever follows (the rest
    might begin a trigger)."""
    if fmt.at_start:
        head = text.lstrip()
        return 0 if any(t.startswith(head) for t in fmt.triggers) else len(text)
    # NOTE: trailing whitespace waits too: before calls it would not be content
    held = max((n for t in fmt.triggers for n in range(1, len(t))
                if text.endswith(t[:n])), default=0)
    return min(len(text) - held, len(text.rstrip()))


def scan_calls(fmt: CallFormat, text: str, start: int, final: bool) -> Scan:
    """Read the calls from `start`; with `final` False an unfinished last call is left out."""
    i = _skip(text, _open_section(fmt, text, start))
    if fmt.list_open:
        if not text.startswith(fmt.list_open, i):
            return Scan((), start)
        i += len(fmt.list_open)
    calls: list[FoundCall] = []
    end = i
    while True:
        j = _skip(text, end)
        if calls and fmt.separator:
            if not text.startswith(fmt.separator, j):
                break
            j += len(fmt.separator)
        step = _one_call(fmt, text, _skip(text, j), final)
        if step is None:
            break
        call, end = step
        calls.append(call)
    j = _skip(text, end)
    if calls and fmt.list_close and text.startswith(fmt.list_close, j):
        end = j + len(fmt.list_close)
    return Scan(tuple(calls), end)


def _open_section(fmt: CallFormat, text: str, i: int) -> int:
    for opener in fmt.section_open:
        if text.startswith(opener, i):
            return i + len(opener)
    return i


def _one_call(fmt: CallFormat, text: str, i: int, final: bool
              ) -> tuple[FoundCall, int] | None:
    """The call at `i` and the offset after it, or None (not there, unfinished, malformed)."""
    if fmt.call_open:
        if not text.startswith(fmt.call_open, i):
            return None
        i = _skip(text, i + len(fmt.call_open))
    try:
        obj, j = _DECODER.raw_decode(text, i)
    except json.JSONDecodeError:
        return None
    call = _as_call(fmt, obj)
    if call is None:
        return None
    if fmt.call_close:
        k = _skip(text, j)
        if text.startswith(fmt.call_close, k):
            return call, k + len(fmt.call_close)
        if final and k == len(text):  # NOTE: a last call left unclosed at the end counts
            return call, k
        return None
    return call, j


def _as_call(fmt: CallFormat, obj: Any) -> FoundCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args: Any = next((obj[k] for k in fmt.args_keys if k in obj), {})
    if isinstance(args, str):
        return FoundCall(obj["name"], args)
    if not isinstance(args, dict):
        return None
    return FoundCall(obj["name"], json.dumps(args, ensure_ascii=False))


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i
