"""The OpenAPI document: it names every route, and a real server keeps its promises
(schemathesis: no server errors, no response outside the documented schema)."""

from __future__ import annotations

from pathlib import Path

import httpx

from gateway.batches.routes import router as batches
from gateway.lora_admin import router as lora
from gateway.routes import router as api
from gateway.tenancy.admin import router as tenancy
from gateway.tokenize import router as tokenizer
from gateway.ui.routes import router as ui
from loadgen.fuzz import run_schemathesis, summarise
from tests.gateway.harness import MODEL, EngineFactory, make_config, running
from tests.serve import GatewayProcess

METHODS = {"get", "post", "delete", "put", "patch"}


async def test_every_route_is_documented_with_its_errors(make_engine: EngineFactory) -> None:
    async with running(make_config(), make_engine()) as h:
        doc = (await h.client.get("/openapi.json")).json()
    routes = {(r.path, m.lower()) for router in (api, tokenizer, batches, ui, tenancy, lora)
              for r in router.routes
              for m in (getattr(r, "methods", None) or ()) if m.lower() in METHODS}
    documented = {(path, m) for path, ops in doc["paths"].items() for m in ops if m in METHODS}
    assert routes == documented
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            if path.startswith("/v1/"):
                assert {"401", "500", "503"} <= set(op["responses"]), (path, method)
                assert "Retry-After" in op["responses"]["503"]["headers"]
            if method == "post" and "requestBody" not in op:
                assert path.endswith(("/cancel", "/reload")), path  # POSTs without a body
    completion = doc["components"]["schemas"]["CompletionRequest"]
    assert MODEL in completion["properties"]["model"]["anyOf"][0]["enum"]


def test_summarise_reads_schemathesis_totals() -> None:
    ok = summarise("Test cases:\n  1226 generated, 1226 passed\n", 0)
    assert (ok.cases, ok.failures) == (1226, 0)
    bad = summarise("Failures:\n  \u274c Server error: 2\n  \u274c ST108 SSE event violates "
                    "schema: 1\n\nFor more information\nTest cases:\n  932 generated, 1 found "
                    "1 unique failure\n", 1)
    assert (bad.cases, bad.server_errors, bad.schema_violations) == (932, 2, 1)


def test_schemathesis_against_the_real_server(tmp_path: Path) -> None:
    args = ["--model", "tiny-random", "--dtype", "float32", "--device-memory-gib", "0.25",
            "--max-model-len", "256", "--log-level", "warning", "--data-dir",
            str(tmp_path / "data")]
    with GatewayProcess(args, tmp_path / "server.log") as server:
        result = run_schemathesis(server.url, max_examples=15, seed=7, out=tmp_path / "st",
                                  timeout_s=300)
        healthy = httpx.get(f"{server.url}/health", timeout=10).status_code == 200
    assert result.cases >= 300, result.output_tail
    assert result.server_errors == 0 and result.schema_violations == 0, result.output_tail
    assert result.exit_code == 0, result.output_tail
    assert healthy
