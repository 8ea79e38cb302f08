"""A real `python -m gateway serve` process on the tiny model with its own data dir."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[3]
TENANTS = """admin_keys: [sk-admin-1]
tenants:
  - name: ide
    api_keys: [sk-ide-1]
    priority: high
    ttft_slo_ms: {slo_ms}
  - name: nightly
    api_keys: [sk-nightly-1]
    priority: low
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """`gateway serve --model MODEL` on a free loopback port; `start` waits for /health."""

    def __init__(self, folder: Path, model: str = "tiny-random", slo_ms: int = 1000,
                 extra: tuple[str, ...] = ()) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "tenants.yaml").write_text(TENANTS.format(slo_ms=slo_ms))
        self.folder, self.port = folder, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [sys.executable, "-m", "gateway", "serve", "--model", model, "--dtype",
                    "float32", "--port", str(self.port), "--tenants",
                    str(folder / "tenants.yaml"), "--data-dir", str(folder / "data"),
                    "--log-level", "warning", *extra]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 120) -> ServerProcess:
        log = open(self.folder / "server.log", "ab")  # noqa: SIM115 - the process owns it
        self.proc = subprocess.Popen(self.cmd, cwd=REPO, stdout=log, stderr=log,
                                     env={**os.environ, "HF_HUB_OFFLINE": "1"})
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log()
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"server did not become healthy:\n{self.log()}")

    def log(self) -> str:
        return (self.folder / "server.log").read_text(errors="replace")[-4000:]

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
