"""The per-app state every route reads: config, engine, quotas, metrics, lifecycle, batches,
the live tenants and their budgets."""

from __future__ import annotations

from dataclasses import dataclass, field

from fastapi import Request

from gateway.admission import Admission
from gateway.batches.service import BatchService
from gateway.config import GatewayConfig
from gateway.engine import Engine
from gateway.lifecycle import Lifecycle
from gateway.metrics import GatewayMetrics
from gateway.quotas import Quotas
from gateway.tenancy.ledger import BudgetLedger
from gateway.tenancy.registry import TenantRegistry
from gateway.tracing.setup import Tracing


@dataclass(slots=True)
class AppState:
    """What one gateway app owns (stored as `app.state.gateway`)."""

    config: GatewayConfig
    engine: Engine
    quotas: Quotas
    metrics: GatewayMetrics
    lifecycle: Lifecycle
    batches: BatchService
    tenants: TenantRegistry  # the running tenants (read `.current`, never config.tenants)
    budgets: BudgetLedger
    tracing: Tracing | None = None  # request spans, with --otlp-traces-endpoint

    admission: Admission = field(init=False)  # the parts a generation request is admitted with

    def __post_init__(self) -> None:
        self.admission = Admission(self.engine, self.quotas, self.metrics,
                                   self.config.server.request_timeout_s,
                                   None if self.tracing is None else self.tracing.record,
                                   self.budgets)


def state_of(request: Request) -> AppState:
    state: AppState = request.app.state.gateway
    return state
