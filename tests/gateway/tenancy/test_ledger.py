"""Token budgets: clipping to what remains, 429 insufficient_quota, reservations, UTC
periods, weights and spend that survives a restart (a real SQLite file)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from gateway.errors import ApiError
from gateway.tenancy.budget import Budget, period, period_end
from gateway.tenancy.ledger import BudgetLedger
from gateway.tenancy.store import TenantStore
from gateway.tenants import Tenant

NOON = datetime(2026, 12, 31, 12, tzinfo=UTC).timestamp()


class Clock:
    def __init__(self, now: float = NOON) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def tenant(daily: int | None = 100, monthly: int | None = None, **weights: float) -> Tenant:
    return Tenant("t", budget=Budget(daily, monthly, **weights))


def test_clips_max_tokens_to_what_remains_then_refuses() -> None:
    ledger, t = BudgetLedger(clock=Clock()), tenant(100)
    assert ledger.plan(t, 10, [50]) == [50]
    hold = ledger.hold(t, 10, 50)
    assert ledger.plan(t, 10, [50]) == [30]  # 100 - 60 reserved - 10 prompt
    hold.settle(10, 20)  # used 30 of its 60
    assert ledger.plan(t, 10, [500]) == [60]
    assert ledger.plan(t, 10, [7], n=3) == [7]
    assert ledger.plan(t, 10, [500, 500], n=3) == [10, 10]  # 6 choices share 60
    ledger.hold(t, 10, 60).settle(10, 60)
    with pytest.raises(ApiError) as info:
        ledger.plan(t, 1, [1])
    assert (info.value.status, info.value.type, info.value.code) == (
        429, "insufficient_quota", "insufficient_quota")
    assert "daily budget of 100 tokens" in info.value.message
    assert "2027-01-01 00:00 UTC" in info.value.message


def test_prompt_alone_over_budget_is_refused() -> None:
    ledger = BudgetLedger(clock=Clock())
    with pytest.raises(ApiError, match="needs at least 101"):
        ledger.plan(tenant(100), 100, [5])


def test_weights_and_the_tighter_window() -> None:
    ledger, t = BudgetLedger(clock=Clock()), tenant(1000, 90, completion_weight=2.0)
    assert ledger.plan(t, 10, [100]) == [40]  # monthly: (90 - 10) / 2
    hold = ledger.hold(t, 10, 40)
    assert hold.reserved == 90
    hold.settle(10, 5)
    assert [u.spent_tokens for u in ledger.usage(t)] == [20, 20]
    assert Budget(prompt_weight=0.1).cost(30, 0) == 3


def test_no_budget_is_metered_not_limited() -> None:
    ledger, t = BudgetLedger(clock=Clock()), Tenant("free")
    assert ledger.plan(t, 10, [10**6]) == [10**6]
    ledger.hold(t, 10, 10**6).settle(10, 5)
    daily, monthly = ledger.usage(t)
    assert (daily.spent_tokens, daily.limit_tokens, daily.remaining_tokens) == (15, None, None)


def test_a_new_utc_day_starts_from_zero_the_month_does_not() -> None:
    clock = Clock()
    ledger, t = BudgetLedger(clock=clock), tenant(100, 1000)
    ledger.hold(t, 50, 50).settle(50, 50)
    with pytest.raises(ApiError):
        ledger.plan(t, 1, [1])
    clock.now = datetime(2027, 1, 1, 0, 0, 1, tzinfo=UTC).timestamp()
    assert ledger.plan(t, 1, [10]) == [10]  # and a new month too
    clock.now = NOON + 86400 * 365  # 2027-12-31
    assert period("daily", clock.now) == "2027-12-31" and period("monthly", NOON) == "2026-12"
    assert period_end("monthly", NOON) == datetime(2027, 1, 1, tzinfo=UTC).timestamp()


def test_spend_survives_a_restart(tmp_path: Path) -> None:
    store = TenantStore(tmp_path / "db.sqlite")
    ledger, t = BudgetLedger(clock=Clock()), tenant(100)
    ledger.attach(store)
    ledger.hold(t, 30, 40).settle(30, 40)
    store.close()
    again = BudgetLedger(clock=Clock())
    again.attach(TenantStore(tmp_path / "db.sqlite"))
    assert [u.spent_tokens for u in again.usage(t)] == [70, 70]
    assert again.plan(t, 10, [100]) == [20]


def test_concurrent_holds_never_exceed_the_budget() -> None:
    ledger, t = BudgetLedger(clock=Clock()), tenant(1000)
    holds = []
    while True:
        try:
            [m] = ledger.plan(t, 7, [64])
        except ApiError:
            break
        holds.append(ledger.hold(t, 7, m))
    assert sum(h.reserved for h in holds) == 994 and len(holds) == 14  # 6 left < a 7-token prompt
    for h in holds:
        h.settle(7, 64)
    assert ledger.usage(t)[0].spent_tokens <= 1000


def test_budget_is_validated() -> None:
    for bad in ({"daily_tokens": 0}, {"monthly_tokens": 1.5}, {"completion_weight": -1},
                {"prompt_weight": float("nan")}):
        with pytest.raises(ValueError):
            Budget(**bad)  # type: ignore[arg-type]
