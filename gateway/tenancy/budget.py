"""A tenant's token budget: limits per UTC day and month, and how tokens are weighted."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

WINDOWS = ("daily", "monthly")


@dataclass(frozen=True, slots=True)
class Budget:
    """Token limits per UTC calendar day and month (None: no limit in that window).

    A request costs `ceil(prompt_weight * prompt_tokens + completion_weight *
    completion_tokens)` budget tokens, in every window at once.
    """

    daily_tokens: int | None = None
    monthly_tokens: int | None = None
    prompt_weight: float = 1.0
    completion_weight: float = 1.0

    def __post_init__(self) -> None:
        for name in ("daily_tokens", "monthly_tokens"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or value < 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("prompt_weight", "completion_weight"):
            value = getattr(self, name)
            if (isinstance(value, bool) or not isinstance(value, int | float)
                    or not math.isfinite(value) or value <= 0):
                raise ValueError(f"{name} must be a positive number, got {value!r}")

    def cost(self, prompt_tokens: int, completion_tokens: int) -> int:
        """Budget tokens a request of this size costs."""
        raw = self.prompt_weight * prompt_tokens + self.completion_weight * completion_tokens
        return math.ceil(raw - 1e-9)  # NOTE: 0.1 * 30 is 3.0000000000000004, still 3

    def limit(self, window: str) -> int | None:
        return self.daily_tokens if window == "daily" else self.monthly_tokens

    def as_dict(self) -> dict[str, int | float | None]:
        return {"daily_tokens": self.daily_tokens, "monthly_tokens": self.monthly_tokens,
                "prompt_weight": self.prompt_weight,
                "completion_weight": self.completion_weight}


UNLIMITED = Budget()  # what a tenant without a budget is metered with


def period(window: str, now_s: float) -> str:
    """The UTC period a wall-clock time falls in: `2026-12-05` (daily), `2026-12` (monthly)."""
    when = datetime.fromtimestamp(now_s, UTC)
    return when.strftime("%Y-%m-%d" if window == "daily" else "%Y-%m")


def period_end(window: str, now_s: float) -> float:
    """Wall-clock s when the period holding `now_s` ends (the next UTC midnight or month)."""
    when = datetime.fromtimestamp(now_s, UTC)
    start = when.replace(hour=0, minute=0, second=0, microsecond=0)
    if window == "daily":
        return (start + timedelta(days=1)).timestamp()
    month = start.replace(day=1)
    return (month.replace(year=month.year + 1, month=1) if month.month == 12
            else month.replace(month=month.month + 1)).timestamp()
