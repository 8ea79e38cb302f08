"""Schemathesis against a running server's `/openapi.json` (over HTTP), summarised.

The checks are the document's promises: no 5xx other than shedding, and every response's
status, content type, headers and body as documented.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

CHECKS = ("not_a_server_error", "status_code_conformance", "content_type_conformance",
          "response_headers_conformance", "response_schema_conformance")
_GENERATED = re.compile(r"(\d+) generated")
_FAILURE = re.compile(r"^\s*\S*\s*(?:ST\d+\s+)?(.+?):\s*(\d+)\s*$", re.M)


@dataclass(frozen=True, slots=True)
class FuzzResult:
    """What one schemathesis run found (failures counted as schemathesis's unique ones)."""

    cases: int  # test cases generated and sent
    server_errors: int  # not_a_server_error failures
    schema_violations: int  # failures of the conformance checks (status, type, headers, body)
    exit_code: int
    output_tail: str

    @property
    def failures(self) -> int:
        return self.server_errors + self.schema_violations

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "failures": self.failures}


def schemathesis_command(url: str, max_examples: int, seed: int, workers: int = 1,
                         headers: tuple[str, ...] = ()) -> list[str]:
    return [sys.executable, "-m", "schemathesis.cli", "run", f"{url}/openapi.json",
            "--checks", ",".join(CHECKS), "--max-examples", str(max_examples),
            "--seed", str(seed), "--workers", str(workers), "--no-color",
            "--generation-database", "none", "--request-timeout", "120",
            *(arg for h in headers for arg in ("--header", h))]


def run_schemathesis(url: str, max_examples: int, seed: int, out: Path,
                     timeout_s: float = 3600.0, workers: int = 1,
                     headers: tuple[str, ...] = ()) -> FuzzResult:
    """Run schemathesis (in `out`, where it may write reports) and summarise its output;
    `headers` ("Name: value") go with every request."""
    out.mkdir(parents=True, exist_ok=True)
    command = schemathesis_command(url, max_examples, seed, workers, headers)
    proc = subprocess.run(command, cwd=out,
                          capture_output=True, text=True, timeout=timeout_s, check=False)
    text = proc.stdout + proc.stderr
    (out / "schemathesis.txt").write_text(text)
    return summarise(text, proc.returncode)


def summarise(text: str, exit_code: int) -> FuzzResult:
    """Totals from schemathesis's summary: `N generated`, and per check under `Failures:`
    lines like `❌ ST108 SSE event violates schema: 1`."""
    cases = [int(n) for n in _GENERATED.findall(text)]
    server = schema = 0
    section = text.rsplit("Failures:", 1)[1] if "Failures:" in text else ""
    for name, count in _FAILURE.findall(section.split("\n\n", 1)[0]):
        if "server error" in name.lower():
            server += int(count)
        else:
            schema += int(count)
    return FuzzResult(cases[-1] if cases else 0, server, schema, exit_code, text[-3000:])
