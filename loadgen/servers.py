"""Servers the bench starts: slicegate (``python -m gateway serve``) and the peers.

Each runs as a subprocess in its own session, logging to a file; the bench
waits until its readiness URL answers 200 and stops it by PID (SIGTERM, then
SIGKILL for the process group it started, after a grace period).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

PEERS_DIR = Path(__file__).resolve().parent / "peers"  # vllm-cpu.sh, transformers-serve.sh
_POLL_S = 0.5
_LOG_TAIL_CHARS = 1500


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """How to start one server and how to talk to it."""

    name: str
    command: tuple[str, ...]
    port: int
    ready_path: str = "/health"  # GET answers 200 once the server serves
    model: str | None = None  # the "model" field requests carry; None: the first of /v1/models
    ready_timeout_s: float = 600.0
    stop_timeout_s: float = 30.0  # SIGTERM grace (slicegate drains in-flight requests)
    dialect: str = "vllm"  # how requests ask for exact output lengths (loadgen.client)
    env: tuple[tuple[str, str], ...] = ()  # added to this process's environment

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class ServerError(RuntimeError):
    """A server that did not start; the message carries the end of its log."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def slicegate_command(serve_cmd: Sequence[str], *, model: str, policy: str, tenants: Path,
                      port: int, devices: str | None, dtype: str | None,
                      max_model_len: int | None, extra: Sequence[str] = ()) -> tuple[str, ...]:
    """``serve_cmd`` (default ``python -m gateway serve``) with the bench's flags."""
    args = [*serve_cmd, "--model", model, "--policy", policy, "--tenants", str(tenants),
            "--host", "127.0.0.1", "--port", str(port)]
    if devices:
        args += ["--devices", devices]
    if dtype:
        args += ["--dtype", dtype]
    if max_model_len:
        args += ["--max-model-len", str(max_model_len)]
    return (*args, *extra)


def default_serve_cmd() -> tuple[str, ...]:
    return (sys.executable, "-m", "gateway", "serve")


def peer_spec(peer: str, folder: Path, port: int, peers_dir: Path = PEERS_DIR,
              ready_timeout_s: float = 1800.0) -> ServerSpec:
    """The vLLM CPU (priority scheduling) or transformers-serve peer on ``folder``."""
    if peer == "vllm":
        command: tuple[str, ...] = ("bash", str(peers_dir / "vllm-cpu.sh"), str(folder),
                                    str(port), "--scheduling-policy", "priority")
        return ServerSpec("vllm", command, port, "/health", "peer", ready_timeout_s)
    if peer == "transformers":
        command = ("bash", str(peers_dir / "transformers-serve.sh"), str(folder), str(port))
        return ServerSpec("transformers", command, port, "/v1/models", str(folder),
                          ready_timeout_s, dialect="transformers")
    raise ValueError(f"unknown peer {peer!r} (known: vllm, transformers)")


class RunningServer:
    """A started server process; use as a context manager to stop it on the way out."""

    def __init__(self, spec: ServerSpec, log_path: Path) -> None:
        self.spec = spec
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = log_path.open("wb")
        self.process = subprocess.Popen(
            list(spec.command), stdout=self._log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True, env={**os.environ, **dict(spec.env)})

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_ready(self) -> None:
        """Block until the readiness URL answers 200; ServerError if it exits or times out."""
        deadline = time.monotonic() + self.spec.ready_timeout_s
        url = self.spec.url + self.spec.ready_path
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerError(f"{self.spec.name} exited with code {self.process.returncode} "
                                  f"before it was ready: {self.log_tail()}")
            try:
                if httpx.get(url, timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(_POLL_S)
        raise ServerError(f"{self.spec.name} not ready after {self.spec.ready_timeout_s:.0f} s "
                          f"({url}): {self.log_tail()}")

    def stop(self) -> int | None:
        """SIGTERM the PID, wait, then SIGKILL what is left of its process group; the exit code."""
        pid = self.process.pid
        if self.process.poll() is None:
            os.kill(pid, signal.SIGTERM)
            try:
                self.process.wait(self.spec.stop_timeout_s)
            except subprocess.TimeoutExpired:
                os.kill(pid, signal.SIGKILL)
                self.process.wait()
        # NOTE: the session (and group) is the one this process started for the server; it
        # catches children (vLLM's engine core) that outlive their parent.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        self._log.close()
        return self.process.returncode

    def log_tail(self) -> str:
        self._log.flush()
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return text[-_LOG_TAIL_CHARS:].strip() or "(empty log)"
