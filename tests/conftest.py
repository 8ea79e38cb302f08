"""Shared fixtures: model folders built or prepared once per test session."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

# NOTE: tests never reach a model hub; every model folder is local.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from models.default_model import prepare_default  # noqa: E402
from models.tiny import tiny_random_dir  # noqa: E402


@pytest.fixture(autouse=True)
def _seed_torch() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _root_logging() -> Iterator[None]:
    """The root logger's handlers and level as they were: a test that runs `main()` in
    process installs the server's handler on pytest's captured stderr, which is closed once
    that test ends (later records would hit a closed file)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture(autouse=True)
def _data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every app a test starts keeps its Batch API state in the test's own folder."""
    monkeypatch.setenv("SLICEGATE_DATA_DIR", str(tmp_path / "slicegate-data"))


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """A tiny random Llama folder (tied embeddings), cached across sessions."""
    return tiny_random_dir("llama")


@pytest.fixture(scope="session")
def tiny_qwen2_dir() -> Path:
    """A tiny random Qwen2 folder (untied embeddings), cached across sessions."""
    return tiny_random_dir("qwen2")


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """SmolLM2-135M-Instruct as a float32 folder; the first session downloads and converts it."""
    return prepare_default()
