"""A cap on the length of a JSON number under a JSON grammar.

A JSON schema's `number` or `integer` has no length limit, and a small model
sampling under one can write digits until max_tokens, leaving output that does
not parse. Once a number outside a string reaches `MAX_NUMBER_CHARS` characters
(24: the longest float repr, as in `-2.2250738585072014e-308`), the tokens
that would extend it are banned as well, where the grammar leaves another way
on (`,`, `}` or `]`), so the number ends and the output validates.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MAX_NUMBER_CHARS = 24
NUMBER_BYTES = frozenset(b"0123456789.eE+-")
NUMBER_STARTS = frozenset(b"-0123456789")
QUOTE, BACKSLASH = ord('"'), ord("\\")


def number_continuing(token_bytes: list[bytes]) -> torch.Tensor:
    """[V] bool: True for the tokens whose first byte could extend a JSON number."""
    return torch.tensor([bool(b) and b[0] in NUMBER_BYTES for b in token_bytes],
                        dtype=torch.bool)


@dataclass(slots=True)
class NumberRun:
    """Where a JSON text stands after the bytes fed so far: inside a string or not, and the
    length of the number it ends with (0 when it does not end with one)."""

    in_string: bool = False
    escaped: bool = False
    run: int = 0

    def feed(self, data: bytes) -> None:
        for byte in data:
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif byte == BACKSLASH:
                    self.escaped = True
                elif byte == QUOTE:
                    self.in_string = False
            elif byte == QUOTE:
                self.in_string, self.run = True, 0
            elif byte in NUMBER_STARTS or (self.run and byte in NUMBER_BYTES):
                self.run += 1
            else:
                self.run = 0

    @property
    def at_cap(self) -> bool:
        return self.run >= MAX_NUMBER_CHARS


def capped(banned: torch.Tensor, continuing: torch.Tensor) -> torch.Tensor:
    """`banned` with the number-extending tokens banned too, unless that leaves none."""
    out = banned | continuing
    return banned if bool(out.all()) else out
