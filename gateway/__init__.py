"""OpenAI-compatible HTTP gateway: tenants, priority, streaming, metrics, graceful lifecycle,
the Batch API (`gateway.batches`) and the admin page (`gateway.ui`)."""

from gateway.app import create_app
from gateway.config import GatewayConfig, load_config
from gateway.engine import Engine, build_engine
from gateway.server import serve

__all__ = ["Engine", "GatewayConfig", "build_engine", "create_app", "load_config", "serve"]
