"""slicegate's version, as `/version` and the OpenAPI document report it."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

PACKAGE = "slicegate"
_PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def package_version() -> str:
    """The installed package's version (an editable install has it too), else pyproject.toml's
    beside the source, else "unknown"."""
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        return str(tomllib.loads(_PYPROJECT.read_text())["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"
