"""Several base models behind one scheduler: their operator chains laid end to end.

A `ModelSet` is a `Model` whose template and operators are its members' chains
one after the other: a member's op `i` is the set's op `first + i`, named
`NAME/embed`, `NAME/layers[0:5]`, `NAME/head`. So the scheduler's parts stay
generic: executors index operators by template index, the GMG and simulator see
op instances, and the estimators, keyed by op name, are keyed by model.

NOTE: members of one KV geometry (layers, KV heads, head size, dtype) share one KV pool per
device, so two instances of one model split their KV as their load goes; a member of
another geometry has pools of its own (`Member.pool`, keyed `device#pool` beside the first
pool's `device`, models/kv_cache.py). Each device's KV room is split between its pools by
`kv_split` (the rule: docs/models.md). A request's blocks hold its own model's KV; the
prefix cache keys blocks by model (scheduler/core/state.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from models.loader import Model
from models.lora import AdapterSet
from models.ops import Op
from models.template import GraphTemplate, OpTemplate


@dataclass(frozen=True, slots=True)
class Member:
    """One model of a set: its name (what requests' `model` says) and where it runs."""

    name: str
    model: Model
    first: int  # the set's index of its first operator
    devices: tuple[str, ...] | None = None  # the devices it runs on; None: every device
    pool: str = ""  # its KV pools' name: "" for the first geometry's, else its first member's
    kv_share: float = 1.0  # its weight in the split of each device's KV room (`kv_split`)

    @property
    def chain(self) -> range:
        """Its operators' indices in the set's chain."""
        return range(self.first, self.first + len(self.model.template.ops))

    def runs_on(self, device: str) -> bool:
        return self.devices is None or device in self.devices


@dataclass
class ModelSet(Model):
    """Models sharing one scheduler (see the module docstring). Its config and dtype are the
    first member's, each member's KV pools its own geometry's. Each member keeps its own LoRA
    adapters (`adapters_of`); the set's `adapters` are the first member's."""

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

    def of_op(self, index: int) -> Member:
        """The member whose chain holds the set's operator `index`."""
        return next(m for m in reversed(self.members) if m.first <= index)

    def model_pools(self) -> dict[str, str]:
        """member -> the name of its KV pools ("": the first geometry's)."""
        return {m.name: m.pool for m in self.members}

    def pools_on(self, device: str) -> dict[str, tuple[Model, float]]:
        """pool -> (the model whose geometry it holds, its share) for the pools of the
        members running on `device`; a pool's share is the sum of its members'."""
        out: dict[str, tuple[Model, float]] = {}
        for m in self.members:
            if m.runs_on(device):
                model, share = out.get(m.pool, (m.model, 0.0))
                out[m.pool] = (model, share + m.kv_share)
        return out

    def devices_of(self, devices: Sequence[str]) -> dict[str, frozenset[str]]:
        """model -> the devices among `devices` its requests may run on."""
        return {m.name: frozenset(d for d in devices if m.runs_on(d)) for m in self.members}


def first_model(model: Model) -> Model:
    """The model itself, or a set's first member: what runs the work that takes one chain
    (a direct timing, the warm-up, a background re-profile of op kinds)."""
    return model.members[0].model if isinstance(model, ModelSet) else model


def adapters_of(model: Model, name: str = "") -> AdapterSet:
    """The LoRA adapters of member `name` of a set ("": the first), or of the model itself
    (its layer ops read them). KeyError for a member the set does not hold."""
    return model.member(name).model.adapters if isinstance(model, ModelSet) else model.adapters


def kv_geometry(model: Model) -> tuple[object, ...]:
    c = model.config
    return (c.num_layers, c.num_kv_heads, c.head_dim, model.dtype)


def _namespaced(name: str, first: int, ops: tuple[OpTemplate, ...]) -> list[OpTemplate]:
    return [replace(t, index=first + t.index, name=f"{name}/{t.name}") for t in ops]


def model_set(entries: Sequence[tuple[str, Model, tuple[str, ...] | None]],
              kv_shares: Mapping[str, float] | None = None) -> ModelSet:
    """The set of `entries` (name, loaded model, its devices or None for every one), each
    member's `kv_share` from `kv_shares` (default 1). ValueError for duplicate names."""
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
    pools: dict[tuple[object, ...], str] = {}
    for name, model, devices in entries:
        pool = pools.setdefault(kv_geometry(model), name if pools else "")
        start = len(templates)
        members.append(Member(name, model, start, devices, pool,
                              (kv_shares or {}).get(name, 1.0)))
        templates += _namespaced(name, start, model.template.ops)
        chains.append((name, start, len(templates)))
        ops += model.ops
    template = GraphTemplate(tuple(templates), first_model.template.layers_per_group,
                             tuple(chains))
    f = first_model
    return ModelSet(names[0], f.path, f.config, f.hf_config, f.dtype, f.device, template, ops,
                    f.kernels, members=tuple(members))
