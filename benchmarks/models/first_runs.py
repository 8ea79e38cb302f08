"""`python -m benchmarks.models first-runs`: what the first prefill at a new prompt length costs.

oneDNN builds a GEMM primitive the first time it meets a row count and keeps
it in a process-wide cache, so the first run of the operator chain at a new
length pays for building them, in whichever operator meets them first. For
each of a few lengths no earlier run of this process used, the chain runs
twice on the same batch, first with layer groups on exact rows, then (at a
length 4 tokens longer, new too) on rows padded to a multiple of
`models.probes.PAD` (`LayerChoice.pad_rows`), and once more at a third length that
pads to the same rows: the first layer group carries the extra where its rows
are new. A second table gives what padding costs once every count has run:
the whole chain on exact and on padded rows, interleaved, medians, for
prefills and for decode steps of a few sequences (padded here as if
`EXACT_ROWS` were 0: the server keeps such batches exact). The other kernels
are the ones `models.tuning` chose for this CPU (its capability line is
printed).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from benchmarks.harness import capability_line, parser, print_table, write_json
from benchmarks.models.cases import BLOCK, ours_batch, per_op_seconds
from models import layers
from models.batch import Batch
from models.cpu import torch_threads
from models.kv_cache import KVCache, blocks_for
from models.layers import padded_rows
from models.loader import Model, load
from models.ops import LayerGroupOp
from models.probes import PAD, median_ms

LENGTHS = (97, 193, 301, 389, 509)  # odd counts: met by no earlier run of the process
STEADY_PREFILLS = (97, 193, 301, 509)
STEADY_DECODES = (3, 8, 20)
DECODE_CONTEXT = 300


def set_pad(model: Model, pad: int) -> None:
    """Make `model`'s layer groups pad their rows to a multiple of `pad` (0: none)."""
    for op in model.ops:
        if isinstance(op, LayerGroupOp):
            op.layer = replace(op.layer, pad_rows=pad)


def _runs(model: Model, kv: KVCache, n: int, times: int) -> list[list[float]]:
    batch = ours_batch(model, kv, [n], [0])
    out = [per_op_seconds(model, batch, kv) for _ in range(times)]
    kv.allocator.free(list(batch.seqs[0].block_table))
    return out


def first_and_second(spec: str, lengths: tuple[int, ...], threads: int
                     ) -> list[dict[str, object]]:
    """Per length n: per-op seconds of the first and second chain run at n on exact rows,
    at n + 4 on padded rows, and the first run at n + 6 (padded to the same rows)."""
    model = load(spec, dtype="bfloat16")
    names = [t.name for t in model.template.ops]
    kv = model.new_kv_cache(blocks_for(max(lengths) + 6, BLOCK), BLOCK)
    rows = []
    with torch_threads(threads):
        for n in lengths:
            set_pad(model, 0)
            first, second = _runs(model, kv, n, 2)
            set_pad(model, PAD)
            pfirst, psecond = _runs(model, kv, n + 4, 2)
            (other,) = _runs(model, kv, n + 6, 1)
            rows.append({"tokens": n, "ops": names, "first_s": first, "second_s": second,
                         "padded_rows": padded_rows(n + 4, PAD),
                         "padded_first_s": pfirst, "padded_second_s": psecond,
                         "padded_other_first_s": other})
    return rows


@contextmanager
def _pad_small_batches() -> Iterator[None]:
    saved, layers.EXACT_ROWS = layers.EXACT_ROWS, 0
    try:
        yield
    finally:
        layers.EXACT_ROWS = saved


def _chain_fn(model: Model, kv: KVCache, batch: Batch, pad: int) -> Callable[[], None]:
    def run() -> None:
        set_pad(model, pad)
        per_op_seconds(model, batch, kv)
    return run


def steady(spec: str, threads: int, repeats: int, prefills: tuple[int, ...] = STEADY_PREFILLS,
           decodes: tuple[int, ...] = STEADY_DECODES) -> list[dict[str, object]]:
    """Per case: ms of the whole chain on exact rows and on padded rows (each warm)."""
    model = load(spec, dtype="bfloat16")
    need = max([*prefills, *(b * (DECODE_CONTEXT + 1) for b in decodes)])
    kv = model.new_kv_cache(blocks_for(need, BLOCK) + 2 * max(decodes, default=1), BLOCK)
    cases = ([(f"prefill {n}", [n], [0]) for n in prefills]
             + [(f"decode b={b}", [1] * b, [DECODE_CONTEXT] * b) for b in decodes])
    rows: list[dict[str, object]] = []
    with torch_threads(threads), _pad_small_batches():
        for name, new, past in cases:
            batch = ours_batch(model, kv, new, past)
            ms = median_ms({"exact": _chain_fn(model, kv, batch, 0),
                            "padded": _chain_fn(model, kv, batch, PAD)}, repeats)
            for seq in batch.seqs:
                kv.allocator.free(list(seq.block_table))
            rows.append({"case": name, **ms})
    set_pad(model, 0)
    return rows


def _num(r: dict[str, object], key: str) -> float:
    v = r[key]
    assert isinstance(v, float)
    return v


def _ms(r: dict[str, object], key: str, op: int = 1) -> float:
    v = r[key]
    assert isinstance(v, list)
    return float(v[op]) * 1e3


def run(spec: str, threads: int, out: Path | None) -> list[dict[str, object]]:
    print(f"CPU: {capability_line()}; {threads} thread(s); bfloat16\n")
    rows = first_and_second(spec, LENGTHS, threads)
    print("first layer group's ms; exact: n tokens on n rows; padded: n + 4 tokens, then "
          f"n + 6, on rows padded to a multiple of {PAD}\n")
    print_table(["n", "exact: first / second", "extra", "padded rows", "padded: first / second",
                 "extra", "n + 6, first run"], "rrrrrrr", (_first_cells(r) for r in rows))
    costs = steady(spec, threads, repeats=7)
    print("\nonce every count has run: the whole chain, ms (medians of 7, interleaved)\n")
    print_table(["case", "exact rows", "padded rows", "padded / exact"], "lrrr",
                ([c["case"], f"{_num(c, 'exact'):.1f}", f"{_num(c, 'padded'):.1f}",
                  f"{_num(c, 'padded') / _num(c, 'exact'):.3f}"] for c in costs))
    write_json(out, {"cpu": capability_line(), "threads": threads, "rows": rows,
                     "steady": costs})
    return rows


def _first_cells(r: dict[str, object]) -> list[object]:
    f, s = _ms(r, "first_s"), _ms(r, "second_s")
    pf, ps, po = (_ms(r, k) for k in ("padded_first_s", "padded_second_s",
                                      "padded_other_first_s"))
    return [r["tokens"], f"{f:.1f} / {s:.1f}", f"{f - s:.1f}", r["padded_rows"],
            f"{pf:.1f} / {ps:.1f}", f"{pf - ps:.1f}", f"{po:.1f}"]


def main(argv: list[str] | None = None) -> list[dict[str, object]]:
    p = parser("python -m benchmarks.models first-runs", __doc__)
    p.add_argument("--model", default="default")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    return run(a.model, a.threads, a.json)
