"""Sampling defaults from a model folder's `generation_config.json`, applied as vLLM applies them.

With `model.generation_config: auto` (the default, as in vLLM) the served
model's folder may recommend sampling values; they fill what a request leaves
out, and a request's own values always win. `none` turns them off (OpenAI's
defaults: temperature 1, top_p 1, no top_k); a folder path reads that folder's
`generation_config.json` instead.

The keys read are vLLM's: `temperature`, `top_p`, `top_k`, `max_new_tokens`
(the default `max_tokens`), `repetition_penalty` and `min_p`. The sampler
implements no min_p, so a folder that sets it to a non-neutral value gets a
warning at start-up and the value is left out, not approximated. `do_sample`
is ignored, as vLLM ignores it: a recommended temperature is what the model's
authors want when they sample.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from gateway.fields import is_int, is_number

logger = logging.getLogger(__name__)

GENERATION_CONFIG_FILE = "generation_config.json"
AUTO, NONE = "auto", "none"
# NOTE: keys vLLM reads that this sampler does not implement -> their neutral value.
_UNSUPPORTED = {"min_p": 0.0}


class GenerationConfigError(ValueError):
    """A generation_config.json that cannot be read or holds an invalid value."""


@dataclass(frozen=True, slots=True)
class SamplingDefaults:
    """What a request gets for each sampling field it omits; None: the OpenAI default."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # 0 = off
    max_tokens: int | None = None  # from max_new_tokens; still capped by the context left
    repetition_penalty: float | None = None  # > 0; 1 = off
    source: str | None = None  # the file they came from, for messages

    def as_dict(self) -> dict[str, float | int]:
        """The fields that are set, e.g. `{"temperature": 0.2, "top_p": 0.9}`."""
        return {f.name: v for f in fields(self)
                if f.name != "source" and (v := getattr(self, f.name)) is not None}

    def describe(self) -> str:
        values = ", ".join(f"{k}={v}" for k, v in self.as_dict().items())
        return f"{values} (from {self.source})" if values else "none (OpenAI defaults)"


def load_sampling_defaults(setting: str, model_path: str | Path) -> SamplingDefaults:
    """The defaults for `setting` ("auto", "none" or a folder) and the served model's folder.

    "auto" reads `model_path`'s generation_config.json and gives no defaults
    when the folder has none; a folder given explicitly must have the file.
    Raises GenerationConfigError for an unreadable file or an invalid value.
    """
    if setting == NONE:
        return SamplingDefaults()
    folder = Path(model_path) if setting == AUTO else Path(setting).expanduser()
    path = folder / GENERATION_CONFIG_FILE
    if not path.is_file():
        if setting == AUTO:
            return SamplingDefaults()
        raise GenerationConfigError(f"generation config {setting!r}: no {path}")
    return parse_generation_config(_read(path), str(path))


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise GenerationConfigError(f"{path}: cannot read it: {exc}") from None
    if not isinstance(data, dict):
        raise GenerationConfigError(f"{path}: expected a JSON object")
    return data


_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "temperature": (lambda v: is_number(v) and v >= 0, ">= 0"),
    "top_p": (lambda v: is_number(v) and 0 < v <= 1, "in (0, 1]"),
    "top_k": (lambda v: is_int(v) and v >= -1, "an integer >= -1"),
    "max_new_tokens": (lambda v: is_int(v) and v >= 1, "a positive integer"),
    "repetition_penalty": (lambda v: is_number(v) and v > 0, "> 0"),
}


def parse_generation_config(data: dict[str, Any], source: str) -> SamplingDefaults:
    """The sampling defaults in a generation_config dict; warns about what is left out."""
    for key, (ok, rule) in _RULES.items():
        if data.get(key) is not None and not ok(data[key]):
            raise GenerationConfigError(f"{source}: {key} must be {rule}, got {data[key]!r}")
    for key, neutral in _UNSUPPORTED.items():
        if data.get(key) is not None and data[key] != neutral:
            logger.warning("%s sets %s=%s, which this server does not implement; left out",
                           source, key, data[key])
    top_k = data.get("top_k")
    return SamplingDefaults(
        temperature=_float(data.get("temperature")), top_p=_float(data.get("top_p")),
        top_k=None if top_k is None else max(top_k, 0),  # NOTE: HF's 0, vLLM's -1: off
        max_tokens=data.get("max_new_tokens"),
        repetition_penalty=_float(data.get("repetition_penalty")), source=source)


def _float(value: float | None) -> float | None:
    return None if value is None else float(value)
