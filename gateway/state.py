"""The per-app state every route reads: config, engine, quotas, metrics, lifecycle, batches."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastapi import Request

from gateway.config import GatewayConfig
from gateway.engine import Engine
from gateway.lifecycle import Lifecycle
from gateway.metrics import GatewayMetrics
from gateway.quotas import Quotas

if TYPE_CHECKING:
    from gateway.batches.service import BatchService


@dataclass(slots=True)
class AppState:
    """What one gateway app owns (stored as `app.state.gateway`)."""

    config: GatewayConfig
    engine: Engine
    quotas: Quotas
    metrics: GatewayMetrics
    lifecycle: Lifecycle
    batches: BatchService


def state_of(request: Request) -> AppState:
    state: AppState = request.app.state.gateway
    return state
