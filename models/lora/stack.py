"""The loaded adapters stacked per linear, and one batch's rows over the stack.

Each layer's five linears (fused q/k/v, o, gate, up, down) get one stacked pair
over every loaded adapter: `a` [R, K] (the adapters' A rows one after another)
and `bt` [R, N] (their B transposed), R the sum of their ranks on it (q, k and v
each add r columns to the fused q/k/v, with B block-diagonal there). A batch
runs, per linear, two GEMMs over the column span of the adapters it uses:

    xa = (x @ a[lo:hi].T) * mask      # [T, hi - lo], mask[i, c] = scaling of row i's
    y += xa @ bt[lo:hi]               #   adapter if column c is its, else 0

NOTE: "masked dense" over the stack, not gathered per row nor a loop over
adapters: a handful of adapters costs two GEMMs and a multiply per linear
whatever their number, and rows need no sorting. The base rows' share is a
zero mask; a batch without adapter rows skips all of it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from models.lora.adapter import LoraAdapter

KINDS = ("qkv", "o", "gate", "up", "down")  # the layer's linears, as `LayerWeights` fuses them
_PARTS = {"qkv": ("q", "k", "v"), "o": ("o",), "gate": ("gate",), "up": ("up",),
          "down": ("down",)}

Shapes = dict[str, tuple[int, int]]  # target ("q", ..., "down") -> (in, out) features


@dataclass(frozen=True, slots=True)
class Stacked:
    """One linear's pairs of every adapter that adapts it, in one layer."""

    a: torch.Tensor  # [R, K]
    bt: torch.Tensor  # [R, N]


@dataclass(frozen=True, slots=True)
class Columns:
    """Which adapter owns each stacked column of one kind of linear."""

    owner: torch.Tensor  # [R] long, adapter id (1-based, 0 = base)
    scale: torch.Tensor  # [R] model dtype, the owner's scaling
    spans: dict[int, tuple[int, int]]  # adapter id -> its columns [lo, hi)


def _row_offsets(shapes: Shapes, kind: str) -> dict[str, int]:
    # where each part's output rows start in the fused linear
    out, at = {}, 0
    for p in _PARTS[kind]:
        out[p] = at
        at += shapes[p][1]
    return out


def _stack_layer(adapters: list[LoraAdapter], layer: int, kind: str, shapes: Shapes,
                 dtype: torch.dtype) -> Stacked | None:
    parts = [(ad, p) for ad in adapters for p in _PARTS[kind] if p in ad.targets]
    if not parts:
        return None
    k = shapes[_PARTS[kind][0]][0]
    n = sum(shapes[p][1] for p in _PARTS[kind])
    r = sum(ad.rank for ad, _ in parts)
    a, bt = torch.zeros(r, k, dtype=dtype), torch.zeros(r, n, dtype=dtype)
    rows, col = _row_offsets(shapes, kind), 0
    for ad, p in parts:
        w = ad.layers[layer].get(p)
        if w is not None:  # NOTE: a layer the adapter leaves alone keeps zeros
            a[col:col + ad.rank] = w.a
            bt[col:col + ad.rank, rows[p]:rows[p] + shapes[p][1]] = w.b.T
        col += ad.rank
    return Stacked(a, bt)


def _columns(adapters: list[LoraAdapter], kind: str, dtype: torch.dtype) -> Columns:
    owner: list[int] = []
    scale: list[float] = []
    spans: dict[int, tuple[int, int]] = {}
    for i, ad in enumerate(adapters, start=1):
        n = ad.rank * sum(p in ad.targets for p in _PARTS[kind])
        if n:
            spans[i] = (len(owner), len(owner) + n)
            owner += [i] * n
            scale += [ad.scaling] * n
    return Columns(torch.tensor(owner, dtype=torch.long), torch.tensor(scale, dtype=dtype),
                   spans)


@dataclass(frozen=True, slots=True)
class LoraStack:
    """Every loaded adapter stacked per layer and linear, on one device. Immutable: adding
    or removing an adapter builds a new stack; a batch holds the one it started with."""

    names: tuple[str, ...]  # adapter id i + 1 is names[i]
    layers: tuple[dict[str, Stacked], ...]  # [num_layers] kind -> pairs (absent: none adapts)
    columns: dict[str, Columns]  # kind -> column owners

    @classmethod
    def build(cls, adapters: list[LoraAdapter], shapes: Shapes, num_layers: int,
              dtype: torch.dtype) -> LoraStack:
        layers = []
        for i in range(num_layers):
            stacked = {kind: _stack_layer(adapters, i, kind, shapes, dtype) for kind in KINDS}
            layers.append({k: s for k, s in stacked.items() if s is not None})
        return cls(tuple(ad.name for ad in adapters), tuple(layers),
                   {kind: _columns(adapters, kind, dtype) for kind in KINDS})

    @staticmethod
    def nbytes_of(adapter: LoraAdapter, shapes: Shapes, num_layers: int) -> int:
        """The bytes `adapter` adds to a stack (pure; B spans the whole fused q/k/v)."""
        n = 0
        for parts in _PARTS.values():
            width = sum(shapes[p][1] for p in parts)
            for p in parts:
                if p in adapter.targets:
                    n += adapter.rank * (shapes[p][0] + width)
        return n * num_layers * torch.empty((), dtype=adapter.dtype).element_size()

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for lay in self.layers for s in lay.values()
                   for t in (s.a, s.bt))

    def to(self, device: torch.device) -> LoraStack:
        layers = tuple({k: Stacked(s.a.to(device), s.bt.to(device)) for k, s in lay.items()}
                       for lay in self.layers)
        columns = {k: Columns(c.owner.to(device), c.scale.to(device), c.spans)
                   for k, c in self.columns.items()}
        return LoraStack(self.names, layers, columns)


@dataclass(frozen=True, slots=True)
class Part:
    """One kind of linear's share of a batch: the stacked columns its adapters span."""

    lo: int
    hi: int
    mask: torch.Tensor  # [T, hi - lo] scaling where the column's adapter is the row's, else 0


@dataclass(frozen=True, slots=True)
class LoraRows:
    """A batch's adapter rows over a stack: built once per batch and device."""

    stack: LoraStack
    parts: dict[str, Part]  # kind -> its span (absent: no row's adapter adapts it)

    @classmethod
    def build(cls, stack: LoraStack, row_ids: torch.Tensor) -> LoraRows:
        """`row_ids` [T] long: each token row's adapter id (0 = base)."""
        used = set(row_ids.unique().tolist()) - {0}
        parts = {}
        for kind, cols in stack.columns.items():
            spans = [cols.spans[i] for i in used if i in cols.spans]
            if not spans:
                continue
            lo, hi = min(s[0] for s in spans), max(s[1] for s in spans)
            hit = row_ids[:, None] == cols.owner[None, lo:hi]  # [T, hi - lo]
            parts[kind] = Part(lo, hi, hit * cols.scale[None, lo:hi])
        return cls(stack, parts)

    def adapts(self, kind: str) -> bool:
        return kind in self.parts

    def add(self, kind: str, layer: int, x: torch.Tensor, y: torch.Tensor) -> None:
        """y[:T] += the low-rank products of x[:T]'s rows for linear `kind` of `layer`."""
        # x: [R, K], y: [R, N], R >= T (rows past T are padding and left alone)
        part = self.parts.get(kind)
        w = self.stack.layers[layer].get(kind)
        if part is None or w is None:
            return
        t = part.mask.shape[0]
        xa = F.linear(x[:t], w.a[part.lo:part.hi]).mul_(part.mask)  # [T, r]
        y[:t].addmm_(xa, w.bt[part.lo:part.hi])
