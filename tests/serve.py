"""`python -m gateway serve ...` as a real subprocess on a free loopback port, for tests.

The server logs to a file (read it with `log()`), is ready when `/health`
answers 200 and is stopped by its PID.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def held_weights_gib(args: list[str], data_dir: Path) -> float:
    """GiB of weights the server holds on cpu:0 when started with `args` (their devices, and
    so their kernels' threads, too), as its own start-up refusal on 0.01 GiB devices says.
    NOTE: it depends on the machine: the kernels tuned for a CPU may keep float32 or
    re-laid-out copies of a half-precision model's weights."""
    proc = subprocess.run([sys.executable, "-m", "gateway", "serve", *args,
                           "--device-memory-gib", "0.01", "--data-dir", str(data_dir),
                           "--port", "0"], cwd=REPO, capture_output=True, text=True, timeout=300)
    found = re.search(r"cpu:0: 0\.01 GiB cannot hold (\d+\.\d\d) GiB of weights", proc.stderr)
    assert proc.returncode == 1 and found, proc.stderr[-2000:]
    return float(found.group(1))


class GatewayProcess:
    """The gateway started with `args` (a port is added); use as a context manager."""

    def __init__(self, args: list[str], log_path: Path, ready_timeout_s: float = 120.0,
                 env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = log_path.open("wb")
        cmd = [sys.executable, "-m", "gateway", "serve", *args, "--port", str(self.port)]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                                     stdout=self._log, stderr=subprocess.STDOUT)
        self._wait_healthy(ready_timeout_s)

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.close()
                raise AssertionError(f"the server exited with {self.proc.returncode}:\n"
                                     f"{self.log()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.close()
        raise AssertionError(f"the server did not become healthy:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._log.close()

    def __enter__(self) -> GatewayProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
