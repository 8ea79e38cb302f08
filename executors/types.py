"""Types shared across the executor boundary (executors <- scheduler)."""

from __future__ import annotations

import enum


class Priority(enum.IntEnum):
    """Request class. Lower value runs first: HIGH (P0) > NORMAL (P1) > LOW (P2)."""

    HIGH = 0
    NORMAL = 1
    LOW = 2

    @classmethod
    def parse(cls, name: str) -> Priority:
        try:
            return cls[name.strip().upper()]
        except KeyError:
            raise ValueError(f"unknown priority {name!r}: use high, normal or low") from None

    @property
    def label(self) -> str:
        return self.name.lower()
