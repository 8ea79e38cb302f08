"""`serve`: run the gateway under uvicorn, with a graceful SIGTERM drain that exits 0.

On the first SIGTERM (or SIGINT) the app starts draining: new API requests
get 503 and /health turns 503 while the listener stays open, and in-flight
requests (streams included) run to completion. Once none is left, or after
`drain_timeout_s`, uvicorn shuts down as usual (requests still running are
cancelled, which aborts them in the scheduler) and `serve` returns. A second
signal shuts down at once. SIGHUP re-reads the tenants file (`reload_tenants`).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Generator
from types import FrameType

import uvicorn

from gateway.accesslog import QuietHttpToolsProtocol
from gateway.app import create_app
from gateway.config import GatewayConfig
from gateway.engine import Engine
from gateway.errors import ApiError
from gateway.lifecycle import Lifecycle
from gateway.logs import configure_logging, uvicorn_log_config
from gateway.state import AppState

logger = logging.getLogger("gateway")

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_CANCEL_GRACE_S = 2  # after the drain: how long uvicorn waits before cancelling requests


class GatewayServer(uvicorn.Server):
    """uvicorn.Server whose first exit signal drains the app before shutting down."""

    def __init__(self, config: uvicorn.Config, lifecycle: Lifecycle,
                 drain_timeout_s: float, on_hangup: Callable[[], None] | None = None) -> None:
        super().__init__(config)
        self.lifecycle = lifecycle
        self.drain_timeout_s = drain_timeout_s
        self.on_hangup = on_hangup  # called on the loop, at the next tick after a SIGHUP
        self._drain_logged = False
        self._hangup = False

    def handle_hangup(self, sig: int, frame: FrameType | None) -> None:
        self._hangup = True  # NOTE: only a flag: the reload runs in on_tick, on the loop

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.lifecycle.draining:  # a second signal: shut down now
            super().handle_exit(sig, frame)
        else:
            self.lifecycle.begin_drain()

    async def on_tick(self, counter: int) -> bool:
        if self._hangup:
            self._hangup = False
            if self.on_hangup is not None:
                self.on_hangup()
        started = self.lifecycle.drain_started
        if started is not None and not self.should_exit:
            if not self._drain_logged:  # NOTE: not in handle_exit: no logging in signal handlers
                self._drain_logged = True
                logger.info("draining: %d request(s) in flight, up to %.0f s",
                            self.lifecycle.in_flight, self.drain_timeout_s)
            if self.lifecycle.idle or time.monotonic() - started >= self.drain_timeout_s:
                self.should_exit = True
        return await super().on_tick(counter)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # NOTE: uvicorn re-raises a captured SIGTERM after shutdown (exit status 143);
        # a drained gateway exits 0 instead, so this version only installs and restores.
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in _SIGNALS}
        original[signal.SIGHUP] = signal.signal(signal.SIGHUP, self.handle_hangup)
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


def make_server(config: GatewayConfig, engine: Engine | None = None) -> GatewayServer:
    """A GatewayServer for `create_app(config, engine)` (not yet running)."""
    app = create_app(config, engine)
    state: AppState = app.state.gateway
    # NOTE: httptools and uvloop (dependencies), ~0.5 ms a request less than h11 on asyncio's
    # loop. Under tests/loadgen/test_chaos.py's overload scenario uvloop once let 3% and 14%
    # of the admitted interactive requests miss their SLO (2 runs of 4); the cause was the
    # policy holding high prefills for low-class decode steps (scheduler/policies/scoring.py
    # `step_first`), and since its fix uvloop kept 100% in 8 runs of 8. The access line is
    # written by the app once the response is out (gateway/accesslog.py), not before it.
    uv_config = uvicorn.Config(app, host=config.server.host, port=config.server.port,
                               log_level=config.server.log_level, lifespan="on",
                               log_config=uvicorn_log_config(),
                               loop="uvloop", http=QuietHttpToolsProtocol,
                               timeout_graceful_shutdown=_CANCEL_GRACE_S,
                               **config.tls.uvicorn_options())
    return GatewayServer(uv_config, state.lifecycle, config.server.drain_timeout_s,
                         lambda: reload_tenants(state))


def reload_tenants(state: AppState) -> None:
    """SIGHUP: re-read the tenants file; a failure is logged and the tenants stay as they were."""
    try:
        state.tenants.reload("signal:SIGHUP")
    except ApiError as exc:
        if exc.code != "invalid_tenants_file":  # that one the registry has logged
            logger.warning("SIGHUP: tenants not reloaded: %s", exc.message)


def serve(config: GatewayConfig, engine: Engine | None = None) -> int:
    """Run the gateway until a signal has drained it; the process exit status (0 = clean).
    Logging is configured as `config.server` says (`gateway.logs.configure_logging`)."""
    # NOTE: again where `main` did it for the start-up lines: uvicorn's loggers write
    # through the root logger's handler, which a caller of `serve` alone has not installed
    configure_logging(config.server.log_level, config.server.log_format)
    server = make_server(config, engine)
    server.run()
    return 0 if server.started else 1
