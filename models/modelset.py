"""Several base models behind one scheduler: their operator chains laid end to end.

A `ModelSet` is a `Model` whose template and operators are its members' chains
one after the other: a member's op `i` is the set's op `first + i`, named
`NAME/embed`, `NAME/layers[0:5]`, `NAME/head`. So the scheduler's parts stay
generic: executors index operators by template index, the GMG and simulator see
op instances, and the estimators, keyed by op name, are keyed by model.

NOTE: one KV pool per device serves every member, so the members must have the
same KV geometry (layers, KV heads, head size, dtype): e.g. two instances of one
model. A request's blocks hold its own model's KV; the prefix cache keys blocks by
model (scheduler/core/state.py). Members of another geometry are refused at
start-up (separate pools per model are not built).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from models.loader import Model
from models.ops import Op
from models.template import GraphTemplate, OpTemplate


@dataclass(frozen=True, slots=True)
class Member:
    """One model of a set: its name (what requests' `model` says) and where it runs."""

    name: str
    model: Model
    first: int  # the set's index of its first operator
    devices: tuple[str, ...] | None = None  # the devices it runs on; None: every device

    @property
    def chain(self) -> range:
        """Its operators' indices in the set's chain."""
        return range(self.first, self.first + len(self.model.template.ops))

    def runs_on(self, device: str) -> bool:
        return self.devices is None or device in self.devices


@dataclass
class ModelSet(Model):
    """Models sharing one scheduler (see the module docstring). Its config, dtype and KV
    layout are the first member's; LoRA adapters are the first member's too."""

    members: tuple[Member, ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        # NOTE: each member's layer ops keep their own adapter set; the set's is the first's
        self.adapters = self.members[0].model.adapters

    def member(self, name: str) -> Member:
        """The member `name` ("": the first). KeyError when none is."""
        for m in self.members:
            if m.name == name or not name:
                return m
        raise KeyError(name)

    def weight_bytes_on(self, device: str) -> int:
        return sum(m.model.template.weight_bytes for m in self.members if m.runs_on(device))

    def weights_note(self, device: str) -> str:
        return ", ".join(f"{m.name} {m.model.template.weight_bytes / 2**30:.2f} GiB"
                         for m in self.members if m.runs_on(device))

    def devices_of(self, devices: Sequence[str]) -> dict[str, frozenset[str]]:
        """model -> the devices among `devices` its requests may run on."""
        return {m.name: frozenset(d for d in devices if m.runs_on(d)) for m in self.members}


def first_model(model: Model) -> Model:
    """The model itself, or a set's first member: what runs the work that takes one chain
    (a direct timing, the warm-up, a background re-profile of op kinds, LoRA adapters)."""
    return model.members[0].model if isinstance(model, ModelSet) else model


def kv_geometry(model: Model) -> tuple[object, ...]:
    c = model.config
    return (c.num_layers, c.num_kv_heads, c.head_dim, model.dtype)


def _namespaced(name: str, first: int, ops: tuple[OpTemplate, ...]) -> list[OpTemplate]:
    return [replace(t, index=first + t.index, name=f"{name}/{t.name}") for t in ops]


def model_set(entries: Sequence[tuple[str, Model, tuple[str, ...] | None]]) -> ModelSet:
    """The set of `entries` (name, loaded model, its devices or None for every one).
    ValueError for duplicate names or members of another KV geometry than the first."""
    if not entries:
        raise ValueError("a model set needs at least one model")
    names = [n for n, _, _ in entries]
    if len(set(names)) != len(names) or not all(names):
        raise ValueError(f"model names must be distinct and non-empty: {names}")
    first_model = entries[0][1]
    members: list[Member] = []
    ops: list[Op] = []
    templates: list[OpTemplate] = []
    chains: list[tuple[str, int, int]] = []
    for name, model, devices in entries:
        if kv_geometry(model) != kv_geometry(first_model):
            raise ValueError(
                f"model {name!r} has another KV layout (layers, KV heads, head size, dtype: "
                f"{kv_geometry(model)}) than {names[0]!r} ({kv_geometry(first_model)}); "
                "models of one server must share it (one KV pool per device serves them all)")
        start = len(templates)
        members.append(Member(name, model, start, devices))
        templates += _namespaced(name, start, model.template.ops)
        chains.append((name, start, len(templates)))
        ops += model.ops
    template = GraphTemplate(tuple(templates), first_model.template.layers_per_group,
                             tuple(chains))
    f = first_model
    return ModelSet(names[0], f.path, f.config, f.hf_config, f.dtype, f.device, template, ops,
                    f.kernels, members=tuple(members))
