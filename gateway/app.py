"""`create_app`: the FastAPI application, with the scheduler started and stopped by its lifespan."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from gateway.accesslog import AccessLogMiddleware
from gateway.batches.context import BatchContext
from gateway.batches.routes import router as batch_router
from gateway.batches.service import DB_NAME, BatchService
from gateway.bodylimit import BodyLimitMiddleware
from gateway.config import GatewayConfig
from gateway.engine import Engine, build_engine
from gateway.errors import install_error_handlers
from gateway.lifecycle import DrainMiddleware, Lifecycle, startup_heap_frozen
from gateway.lora_admin import router as lora_router
from gateway.metrics import GatewayMetrics
from gateway.quotas import Quotas
from gateway.routes import router
from gateway.state import AppState
from gateway.tenancy.admin import router as tenants_router
from gateway.tenancy.ledger import BudgetLedger
from gateway.tenancy.registry import TenantRegistry
from gateway.tenancy.store import TenantStore
from gateway.tokenize import router as tokenize_router
from gateway.tracing.setup import SpanCounts, start_tracing
from gateway.ui.routes import router as ui_router

_MULTIPART_SLACK_BYTES = 1 << 20  # form fields and part headers around an uploaded file


def create_app(config: GatewayConfig, engine: Engine | None = None) -> FastAPI:
    """The gateway app for `config`; `engine` defaults to `build_engine(config)`.

    The app's lifespan starts the engine's scheduler and the Batch API (which
    resumes unfinished batches) and, on shutdown, stops the Batch API and then
    the scheduler (draining for up to `config.server.drain_timeout_s`), then
    flushes the trace exporter, if tracing is on. Its state is
    `app.state.gateway` (an `AppState`). Raises TracingUnavailable when
    `otlp_traces_endpoint` is set without the `otel` extra.
    """
    engine = engine if engine is not None else build_engine(config)
    metrics = GatewayMetrics(engine.served_model_name)
    tenants = TenantRegistry(config.tenants, config.tenants_file)
    tenants.on_swap(lambda current: metrics.set_tenants(current.tenants
                                                        or (current.default_tenant,)))
    budgets = BudgetLedger(lambda: tenants.current.tenants or (tenants.current.default_tenant,))
    metrics.registry.register(budgets)
    batches = BatchService(config.batch)
    metrics.registry.register(batches)
    tracing = start_tracing(endpoint) if (endpoint := config.server.otlp_traces_endpoint) else None
    if tracing is not None:
        metrics.registry.register(SpanCounts(tracing))
    state = AppState(config, engine, Quotas(), metrics, Lifecycle(), batches, tenants, budgets,
                     tracing)
    context = batch_context(state)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await engine.scheduler.start()
        try:
            open_tenant_store(state)
            await batches.start(context)
            try:
                with startup_heap_frozen():
                    yield
            finally:
                state.lifecycle.begin_drain()
                await batches.stop()
        finally:
            state.lifecycle.begin_drain()
            await engine.scheduler.stop(drain=True, timeout_s=config.server.drain_timeout_s)
            close_tenant_store(state)
            if tracing is not None:  # NOTE: last: the spans of the requests drained above
                await asyncio.to_thread(tracing.shutdown)

    app = FastAPI(title="slicegate", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.gateway = state
    app.include_router(router)
    app.include_router(tokenize_router)
    app.include_router(batch_router)
    app.include_router(ui_router)
    app.include_router(tenants_router)
    app.include_router(lora_router)
    app.add_middleware(DrainMiddleware, lifecycle=state.lifecycle)
    upload_limit = config.batch.max_file_bytes + _MULTIPART_SLACK_BYTES
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.server.max_body_bytes,
                       path_limits={"/v1/files": upload_limit})
    install_error_handlers(app)  # its middleware: ids and 500s for everything below it
    if config.cors.enabled:  # NOTE: outside the errors and the drain, so they carry CORS too
        app.add_middleware(CORSMiddleware, **config.cors.middleware_options())
    app.add_middleware(AccessLogMiddleware)  # outermost: it logs the 500s too
    return app


def batch_context(state: AppState) -> BatchContext:
    """The parts of `state` that batch lines run with."""
    return BatchContext(state.admission, state.config.server.max_prompts_per_request,
                        state.tenants, state.lifecycle)


def open_tenant_store(state: AppState) -> None:
    """The tenant tables of the data dir's database, applied to the running tenants.
    NOTE: before the Batch API starts, so that resumed batches find admin-made tenants."""
    state.batches.data_dir.mkdir(parents=True, exist_ok=True)
    store = TenantStore(state.batches.data_dir / DB_NAME)
    state.tenants.open(store)
    state.budgets.attach(store)


def close_tenant_store(state: AppState) -> None:
    """After the scheduler stopped, so every request in flight has settled its spend."""
    state.budgets.attach(None)
    store = state.tenants.close()
    if store is not None:
        store.close()
