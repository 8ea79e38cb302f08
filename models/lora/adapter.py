"""A PEFT LoRA adapter read from its folder and checked against the base model.

A PEFT folder holds `adapter_config.json` (r, lora_alpha, target_modules, ...)
and `adapter_model.safetensors` (or `adapter_model.bin`) with, per layer and
target, `...layers.{i}.{self_attn|mlp}.{name}_proj.lora_A.weight` [r, in] and
`lora_B.weight` [out, r]. The weights are kept as they are (no merge into the
base): the layers add `scaling * (x @ A.T) @ B.T` to the target's output.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

TARGETS = ("q", "k", "v", "o", "gate", "up", "down")  # the `*_proj` linears a layer has
_KEY = re.compile(r"^(?:base_model\.model\.)?model\.layers\.(\d+)\.(?:self_attn|mlp)\."
                  r"(q|k|v|o|gate|up|down)_proj\.lora_([AB])(?:\.[^.]+)?\.weight$")


class AdapterError(ValueError):
    """An adapter that cannot run on this model: the message says why."""


class BaseModel(Protocol):
    """What an adapter is checked against (`models.loader.Model`)."""

    name: str
    dtype: torch.dtype

    def lora_shapes(self) -> dict[str, tuple[int, int]]: ...  # target -> (in, out) features

    @property
    def num_layers(self) -> int: ...


@dataclass(frozen=True, slots=True)
class LoraWeights:
    """One target linear's low-rank pair in one layer."""

    a: torch.Tensor  # [r, in]
    b: torch.Tensor  # [out, r]


@dataclass(frozen=True, slots=True)
class LoraAdapter:
    """A LoRA adapter: per layer, a low-rank pair for each target linear it adapts."""

    name: str
    path: Path
    rank: int
    scaling: float  # lora_alpha / r (/ sqrt(r) with rsLoRA)
    targets: tuple[str, ...]  # of TARGETS, in that order
    layers: tuple[dict[str, LoraWeights], ...]  # [num_layers] target -> weights (absent: none)
    dtype: torch.dtype

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise AdapterError(f"adapter {self.name!r}: rank must be >= 1, got {self.rank}")
        if not self.targets:
            raise AdapterError(f"adapter {self.name!r} adapts no linear of the model")

    @property
    def nbytes(self) -> int:
        """Bytes of its A and B tensors."""
        return sum(t.numel() * t.element_size() for layer in self.layers
                   for w in layer.values() for t in (w.a, w.b))


_REFUSED = {  # adapter_config.json options the layers do not implement -> why
    "use_dora": "DoRA adapters are not supported",
    "modules_to_save": "adapters with modules_to_save (fully trained modules) are not supported",
    "rank_pattern": "a per-module rank_pattern is not supported",
    "alpha_pattern": "a per-module alpha_pattern is not supported",
    "fan_in_fan_out": "fan_in_fan_out (Conv1D-style weights) is not supported",
    "use_qalora": "QA-LoRA adapters are not supported",
    "lora_bias": "adapters with a bias on lora_B are not supported",
}


def _read_config(name: str, path: Path) -> dict[str, Any]:
    file = path / "adapter_config.json"
    if not path.is_dir():
        raise AdapterError(f"adapter {name!r}: {path} is not a folder")
    if not file.is_file():
        raise AdapterError(f"adapter {name!r}: {path} has no adapter_config.json")
    try:
        cfg = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise AdapterError(f"adapter {name!r}: adapter_config.json does not read: {e}") from None
    if not isinstance(cfg, dict):
        raise AdapterError(f"adapter {name!r}: adapter_config.json is not an object")
    return cfg


def _check_config(name: str, cfg: dict[str, Any]) -> tuple[int, float]:
    """(rank, scaling) of a config the layers can run, else AdapterError."""
    if str(cfg.get("peft_type", "LORA")).upper() != "LORA":
        raise AdapterError(f"adapter {name!r}: peft_type {cfg.get('peft_type')!r} is not LORA")
    for key, why in _REFUSED.items():
        if cfg.get(key):
            raise AdapterError(f"adapter {name!r}: {why} ({key}={cfg[key]!r})")
    if cfg.get("bias", "none") != "none":
        raise AdapterError(f"adapter {name!r}: bias={cfg['bias']!r} is not supported "
                           "(only bias='none')")
    r, alpha = cfg.get("r"), cfg.get("lora_alpha", cfg.get("r"))
    if not isinstance(r, int) or isinstance(r, bool) or r < 1:
        raise AdapterError(f"adapter {name!r}: r must be a positive integer, got {r!r}")
    if not isinstance(alpha, int | float) or isinstance(alpha, bool):
        raise AdapterError(f"adapter {name!r}: lora_alpha must be a number, got {alpha!r}")
    return r, alpha / (math.sqrt(r) if cfg.get("use_rslora") else r)


def _read_tensors(name: str, path: Path) -> dict[str, torch.Tensor]:
    st, bin_ = path / "adapter_model.safetensors", path / "adapter_model.bin"
    try:
        if st.is_file():
            from safetensors.torch import load_file
            return load_file(st)
        if bin_.is_file():
            out = torch.load(bin_, map_location="cpu", weights_only=True)
            if isinstance(out, dict):
                return out
            raise AdapterError(f"adapter {name!r}: adapter_model.bin holds no tensors")
    except AdapterError:
        raise
    except Exception as e:  # NOTE: a corrupt file is the adapter's fault, not the server's
        raise AdapterError(f"adapter {name!r}: its weights do not read: "
                           f"{type(e).__name__}: {e}") from None
    raise AdapterError(f"adapter {name!r}: {path} has neither adapter_model.safetensors "
                       "nor adapter_model.bin")


def _pairs(name: str, tensors: dict[str, torch.Tensor], num_layers: int
           ) -> dict[tuple[int, str], dict[str, torch.Tensor]]:
    """(layer, target) -> {"A": [r, in], "B": [out, r]}; any other tensor is refused."""
    out: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        m = _KEY.match(key)
        if m is None:
            raise AdapterError(f"adapter {name!r}: tensor {key!r} is not a LoRA pair of a "
                               f"decoder layer's q/k/v/o/gate/up/down projection")
        layer = int(m.group(1))
        if layer >= num_layers:
            raise AdapterError(f"adapter {name!r}: tensor {key!r} names layer {layer}; the "
                               f"model has {num_layers}")
        out.setdefault((layer, m.group(2)), {})[m.group(3)] = t
    return out


def _weights(name: str, pair: dict[str, torch.Tensor], where: tuple[int, str], rank: int,
             shape: tuple[int, int], dtype: torch.dtype) -> LoraWeights:
    layer, target = where
    if set(pair) != {"A", "B"}:
        raise AdapterError(f"adapter {name!r}: layer {layer} {target}_proj lacks lora_"
                           f"{'B' if 'A' in pair else 'A'}")
    a, b = pair["A"], pair["B"]
    fin, fout = shape
    if a.dim() != 2 or b.dim() != 2 or a.shape[0] != rank or b.shape[1] != rank:
        raise AdapterError(f"adapter {name!r}: layer {layer} {target}_proj has lora_A "
                           f"{tuple(a.shape)} and lora_B {tuple(b.shape)}, not of rank r={rank} "
                           "(adapter_config.json)")
    if tuple(a.shape) != (rank, fin) or tuple(b.shape) != (fout, rank):
        raise AdapterError(
            f"adapter {name!r}: layer {layer} {target}_proj has lora_A {tuple(a.shape)} and "
            f"lora_B {tuple(b.shape)}; the base model needs ({rank}, {fin}) and "
            f"({fout}, {rank}): is it an adapter of another base model?")
    return LoraWeights(a.to(dtype).contiguous(), b.to(dtype).contiguous())


def load_peft_adapter(name: str, path: str | Path, model: BaseModel) -> LoraAdapter:
    """The PEFT adapter in folder `path`, as `name`, checked against `model` (AdapterError
    with the reason when it cannot run on it)."""
    path = Path(path).expanduser()
    cfg = _read_config(name, path)
    rank, scaling = _check_config(name, cfg)
    shapes = model.lora_shapes()
    pairs = _pairs(name, _read_tensors(name, path), model.num_layers)
    layers: list[dict[str, LoraWeights]] = [{} for _ in range(model.num_layers)]
    for (layer, target), pair in pairs.items():
        layers[layer][target] = _weights(name, pair, (layer, target), rank, shapes[target],
                                         model.dtype)
    targets = tuple(t for t in TARGETS if any(t in lay for lay in layers))
    return LoraAdapter(name, path, rank, scaling, targets, tuple(layers), model.dtype)
