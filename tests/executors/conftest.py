"""Fixtures for executor tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from models.loader import Model, load


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir: Path) -> Model:
    """The tiny random Llama, fp32, two layers per group: embed, layers[0:2], layers[2:4], head."""
    return load(tiny_model_dir, dtype="float32", layers_per_group=2)
