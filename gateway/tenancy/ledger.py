"""Token budgets: spend per tenant and UTC day/month, reserved at admission, settled at the end.

NOTE: "no token beyond the budget is served": a request is admitted only if its prompt
plus its `max_tokens` (every choice's) fits what remains of each of the tenant's budget
windows, after what requests in flight have reserved. When the prompt fits but the
`max_tokens` asked for (or defaulted to) does not, `max_tokens` is clipped to what
remains, so the answer ends with finish_reason "length" where the budget ends; when not
even the prompt and one token per choice fit, the request gets 429 `insufficient_quota`.
A request reserves its worst case and is settled to what it really used when it ends,
so spent + reserved never exceeds a limit. Every tenant's spend is metered, budget or not.

Spend is written to the store at each settlement (one SQLite transaction, WAL, tens of
microseconds), so a restart keeps all of it; a crash loses only what requests in flight
had not yet settled.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gateway.errors import ApiError
from gateway.tenancy.budget import UNLIMITED, WINDOWS, Budget, period, period_end
from gateway.tenancy.store import TenantStore
from gateway.tenants import Tenant

logger = logging.getLogger("gateway.tenants")


@dataclass(slots=True)
class BudgetHold:
    """One admitted request's reservation in its tenant's budget; settle it once."""

    ledger: BudgetLedger
    tenant: str
    budget: Budget
    reserved: int  # budget tokens held back until the request ends
    settled: bool = False

    def settle(self, prompt_tokens: int, completion_tokens: int) -> None:
        """End the request: free the reservation, charge what it used."""
        if self.settled:
            return
        self.settled = True
        self.ledger.settle(self, self.budget.cost(prompt_tokens, completion_tokens))


@dataclass(frozen=True, slots=True)
class WindowUsage:
    """A tenant's spend in the current period of one window."""

    window: str  # "daily" | "monthly"
    period: str  # "2026-12-05" | "2026-12"
    spent_tokens: int
    reserved_tokens: int  # by requests in flight
    limit_tokens: int | None
    resets_at: float  # wall-clock s

    @property
    def remaining_tokens(self) -> int | None:
        if self.limit_tokens is None:
            return None
        return max(self.limit_tokens - self.spent_tokens - self.reserved_tokens, 0)

    def as_dict(self) -> dict[str, object]:
        return {"period": self.period, "spent_tokens": self.spent_tokens,
                "reserved_tokens": self.reserved_tokens, "limit_tokens": self.limit_tokens,
                "remaining_tokens": self.remaining_tokens,
                "resets_at": datetime.fromtimestamp(self.resets_at, UTC).isoformat()}


class BudgetLedger:
    """Every tenant's spend; `plan` is pure, `hold` commits a reservation."""

    def __init__(self, tenants: Callable[[], Iterable[Tenant]] = tuple,
                 clock: Callable[[], float] = time.time) -> None:
        self._tenants = tenants  # the running tenants, for /metrics
        self._clock = clock
        self._spent: dict[tuple[str, str], int] = {}  # (tenant, "daily:2026-12-05") -> tokens
        self._loaded: set[str] = set()  # period keys read from the store
        self._reserved: dict[str, int] = {}
        self._charged_total: dict[str, int] = {}  # since start, for the /metrics counter
        self._store: TenantStore | None = None

    def attach(self, store: TenantStore | None) -> None:
        """Keep spend in `store` from now on (None: in memory only, e.g. while stopping)."""
        self._store = store
        self._loaded.clear()
        if store is not None:
            self._spent.clear()

    def usage(self, tenant: Tenant) -> list[WindowUsage]:
        now = self._clock()
        budget = tenant.budget or UNLIMITED
        return [WindowUsage(w, period(w, now), self._spent_in(tenant.name, _key(w, now)),
                            self._reserved.get(tenant.name, 0), budget.limit(w),
                            period_end(w, now)) for w in WINDOWS]

    def plan(self, tenant: Tenant, prompt_tokens: int, max_tokens: list[int],
             n: int = 1) -> list[int]:
        """Each prompt's `max_tokens`, clipped to the budget, for `n` choices per prompt (429
        `insufficient_quota` when not even the prompts and a token per choice fit).
        `prompt_tokens`: all prompts', each counted once."""
        budget = tenant.budget
        limited = [u for u in self.usage(tenant) if u.limit_tokens is not None]
        if budget is None or not limited:
            return max_tokens
        window = min(limited, key=lambda u: u.remaining_tokens or 0)
        remaining = window.remaining_tokens or 0
        choices = len(max_tokens) * n
        room = remaining - budget.cost(prompt_tokens, 0)
        cap = min(max(max_tokens), int(room / (budget.completion_weight * choices)))
        while cap >= 1 and budget.cost(prompt_tokens, cap * choices) > remaining:
            cap -= 1  # NOTE: float rounding at most; the division above is exact otherwise
        if cap < 1:
            raise _exhausted(tenant, window, budget.cost(prompt_tokens, choices))
        return [min(m, cap) for m in max_tokens]

    def hold(self, tenant: Tenant, prompt_tokens: int, completion_tokens: int) -> BudgetHold:
        """Reserve a planned request's worst case (all prompts, all choices' max_tokens)."""
        budget = tenant.budget or UNLIMITED
        reserved = budget.cost(prompt_tokens, completion_tokens) if tenant.budget else 0
        self._reserved[tenant.name] = self._reserved.get(tenant.name, 0) + reserved
        return BudgetHold(self, tenant.name, budget, reserved)

    def settle(self, hold: BudgetHold, cost: int) -> None:
        """Free `hold`'s reservation and charge `cost` to the current periods."""
        self._reserved[hold.tenant] -= hold.reserved
        if cost <= 0:
            return
        now = self._clock()
        keys = [_key(w, now) for w in WINDOWS]
        for key in keys:
            self._spent[(hold.tenant, key)] = self._spent_in(hold.tenant, key) + cost
        self._charged_total[hold.tenant] = self._charged_total.get(hold.tenant, 0) + cost
        if self._store is not None:
            try:
                self._store.add_spend(hold.tenant, keys, cost)
            except Exception:  # NOTE: a failed write must not fail the request that is done
                logger.exception("tenants: could not save %d tokens of %r's spend", cost,
                                 hold.tenant)

    def _spent_in(self, tenant: str, key: str) -> int:
        if key not in self._loaded and self._store is not None:
            self._loaded.add(key)
            for (name, _), tokens in self._store.spend([key]).items():
                self._spent[(name, key)] = tokens
        return self._spent.get((tenant, key), 0)

    def collect(self) -> Iterator[Metric]:
        """Spend and limits per tenant and window for /metrics."""
        spent = GaugeMetricFamily("slicegate_tenant_budget_spent_tokens", "Budget tokens a "
                                  "tenant spent in the current UTC day or month.",
                                  labels=["tenant", "window"])
        limit = GaugeMetricFamily("slicegate_tenant_budget_limit_tokens", "A tenant's token "
                                  "budget per UTC day or month.", labels=["tenant", "window"])
        charged = CounterMetricFamily("slicegate_tenant_budget_charged_tokens", "Budget tokens "
                                      "charged to a tenant since start.", labels=["tenant"])
        for tenant in self._tenants():
            for u in self.usage(tenant):
                spent.add_metric([tenant.name, u.window], u.spent_tokens)
                if u.limit_tokens is not None:
                    limit.add_metric([tenant.name, u.window], u.limit_tokens)
            charged.add_metric([tenant.name], self._charged_total.get(tenant.name, 0))
        yield from (spent, limit, charged)


def _key(window: str, now: float) -> str:
    return f"{window}:{period(window, now)}"


def _exhausted(tenant: Tenant, window: WindowUsage, needed: int) -> ApiError:
    reset = datetime.fromtimestamp(window.resets_at, UTC).strftime("%Y-%m-%d %H:%M UTC")
    return ApiError(429, f"You exceeded your current quota: tenant {tenant.name!r} has "
                         f"{window.remaining_tokens} of its {window.window} budget of "
                         f"{window.limit_tokens} tokens left ({window.spent_tokens} spent, "
                         f"{window.reserved_tokens} reserved by requests in flight), and this "
                         f"request needs at least {needed} (its prompt and one token per "
                         f"choice). The budget resets at {reset}.",
                    type="insufficient_quota", code="insufficient_quota")
