"""What the batch service, feeder and runner take from the app: exactly this, never the
whole app state, so the batch modules import neither `gateway.state` nor the endpoints."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.admission import Admission
from gateway.lifecycle import Lifecycle
from gateway.tenancy.registry import TenantRegistry


@dataclass(frozen=True, slots=True)
class BatchContext:
    """The app's parts batch lines run with (built beside the app's `AppState`)."""

    admission: Admission  # engine, quotas, metrics, deadline: a line is admitted as a request is
    max_prompts_per_request: int  # a completions line's list of prompts, as the endpoint's
    tenants: TenantRegistry  # a batch's tenant, by name, in the running tenants
    lifecycle: Lifecycle  # no line is fed while the app drains
