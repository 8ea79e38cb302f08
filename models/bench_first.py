"""`python -m models first-runs`: what the first prefill at a new prompt length costs.

oneDNN builds a GEMM primitive the first time it meets a row count and keeps
it in a process-wide cache, so the first run of the operator chain at a new
length pays for building them, in whichever operator meets them first. For
each of a few lengths no earlier run of this process used, the chain runs
twice on the same batch; the table shows each operator's first and second
time (the first layer group carries the extra), and the kernels are the ones
`models.tuning` chose for this CPU (its capability line is printed).
"""

from __future__ import annotations

import json
from pathlib import Path

from models.bench_cases import BLOCK, ours_batch, per_op_seconds
from models.cpu import cpu_caps, torch_threads
from models.kv_cache import blocks_for
from models.loader import load

LENGTHS = (97, 193, 301, 389, 509)  # odd counts: met by no earlier run of the process


def first_and_second(spec: str, lengths: tuple[int, ...], threads: int
                     ) -> list[dict[str, object]]:
    """Per length: per-op seconds of the first and of the second chain run."""
    model = load(spec, dtype="bfloat16")
    names = [t.name for t in model.template.ops]
    kv = model.new_kv_cache(blocks_for(max(lengths), BLOCK), BLOCK)
    rows = []
    with torch_threads(threads):
        for n in lengths:
            batch = ours_batch(model, kv, [n], [0])
            first, second = per_op_seconds(model, batch, kv), per_op_seconds(model, batch, kv)
            kv.allocator.free(list(batch.seqs[0].block_table))
            rows.append({"tokens": n, "ops": names, "first_s": first, "second_s": second})
    return rows


def run(spec: str, threads: int, out: Path | None) -> list[dict[str, object]]:
    print(f"CPU: {cpu_caps().line()}; {threads} thread(s); bfloat16\n")
    rows = first_and_second(spec, LENGTHS, threads)
    print("| prompt tokens | first layer group: first / second run ms | extra ms | "
          "other ops: first / second ms |\n|---:|---:|---:|---:|")
    for r in rows:
        f, s = r["first_s"], r["second_s"]
        assert isinstance(f, list) and isinstance(s, list)
        print(f"| {r['tokens']} | {f[1] * 1e3:.1f} / {s[1] * 1e3:.1f} | "
              f"{(f[1] - s[1]) * 1e3:.1f} | {sum(f[2:]) * 1e3:.1f} / {sum(s[2:]) * 1e3:.1f} |")
    if out is not None:
        out.write_text(json.dumps({"cpu": cpu_caps().line(), "threads": threads, "rows": rows},
                                  indent=1))
    return rows
