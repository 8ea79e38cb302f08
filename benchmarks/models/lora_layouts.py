"""Three layouts of a batch's low-rank products, timed on one layer's linears (`lora --layouts`).

- "masked" (what `models.lora` runs): per linear, x @ A.T over the stacked columns of the
  batch's adapters, times a row x column scaling mask, then @ B.T into y: 3 ops.
- "grouped": per adapter, its rows gathered, two GEMMs, added back (`index_add_`).
- "gathered": every row's own A and B gathered ([T, r, K] and [T, N, r]), two `bmm`s.

Each is checked equal to a per-row reference before it is timed.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

Layout = Callable[[torch.Tensor, torch.Tensor], None]  # (x [T, K], y [T, N]) -> y += delta


def _masked(a: torch.Tensor, bt: torch.Tensor, ids: torch.Tensor, rank: int,
            scale: float) -> Layout:
    owner = torch.arange(a.shape[0]) // rank + 1  # [R]
    mask = (ids[:, None] == owner[None, :]) * scale  # [T, R]

    def run(x: torch.Tensor, y: torch.Tensor) -> None:
        y.addmm_(F.linear(x, a).mul_(mask), bt)
    return run


def _grouped(a: torch.Tensor, bt: torch.Tensor, ids: torch.Tensor, rank: int,
             scale: float) -> Layout:
    groups = [(torch.nonzero(ids == i).flatten(), a[(i - 1) * rank:i * rank],
               bt[(i - 1) * rank:i * rank]) for i in ids.unique().tolist() if i]

    def run(x: torch.Tensor, y: torch.Tensor) -> None:
        for rows, ai, bi in groups:
            y.index_add_(0, rows, F.linear(x.index_select(0, rows), ai) @ bi, alpha=scale)
    return run


def _gathered(a: torch.Tensor, bt: torch.Tensor, ids: torch.Tensor, rank: int,
              scale: float) -> Layout:
    k, n = a.shape[1], bt.shape[1]
    a3 = torch.cat([torch.zeros(1, rank, k), a.view(-1, rank, k)])  # [1 + n_ad, r, K]
    b3 = torch.cat([torch.zeros(1, rank, n), bt.view(-1, rank, n)])  # [1 + n_ad, r, N]

    def run(x: torch.Tensor, y: torch.Tensor) -> None:
        xa = torch.bmm(a3[ids], x[:, :, None])  # [T, r, 1]
        y.add_(torch.bmm(b3[ids].transpose(1, 2), xa)[:, :, 0], alpha=scale)
    return run


LAYOUTS = {"masked": _masked, "grouped": _grouped, "gathered": _gathered}


def compare(shapes: dict[str, tuple[int, int]], rows: int, num_adapters: int, rank: int,
            repeats: int) -> dict[str, float]:
    """Median seconds of one layer's five linears' products per layout, `rows` decode rows
    (2 per adapter, the rest base)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.tensor([i // 2 + 1 if i < 2 * num_adapters else 0 for i in range(rows)])
    cases = []
    for fin, fout in shapes.values():
        a = torch.randn(num_adapters * rank, fin, generator=g)
        bt = torch.randn(num_adapters * rank, fout, generator=g)
        x = torch.randn(rows, fin, generator=g)
        want = torch.zeros(rows, fout)
        for i, r in enumerate(ids.tolist()):
            if r:
                want[i] = 0.5 * (a[(r - 1) * rank:r * rank] @ x[i]) @ bt[(r - 1) * rank:r * rank]
        cases.append((a, bt, x, want))
    out = {}
    with torch.inference_mode():
        for name, make in LAYOUTS.items():
            runs = [(make(a, bt, ids, rank, 0.5), x, want) for a, bt, x, want in cases]
            for run, x, want in runs:
                y = torch.zeros_like(want)
                run(x, y)
                torch.testing.assert_close(y, want, rtol=1e-3, atol=1e-3)
            ys = [torch.zeros_like(w) for _, _, w in runs]
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                for (run, x, _), y in zip(runs, ys, strict=True):
                    run(x, y)
                times.append(time.perf_counter() - t0)
            out[name] = statistics.median(times)
    return out
