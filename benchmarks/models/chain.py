"""`python -m benchmarks.models chain`: our operator chain vs transformers' forward vs the GEMM
floor.

Each case (prefill 16 / 64 / 128 / 512 tokens, decode at batch 1 / 8 / 32) is
timed for (a) the operator chain over paged KV, (b) the transformers model's
forward on the same inputs and (c) its GEMM floor (`benchmarks.models.floor`),
interleaved a, b, c, a, b, c, ... with the same dtype and thread count;
medians over repeats. Decode at batch 1 is also set against the time to
stream the weights once at the measured copy bandwidth. The kernels are
measured afresh for this run (`models.tuning`), and the CPU's capability
line is printed beside the table.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from benchmarks.harness import capability_line, parser, print_table, write_json
from benchmarks.models.cases import BLOCK, Case, decode_case, prefill_case
from benchmarks.models.floor import FloorWeights, copy_bandwidth, streamed_bytes
from models import native, probes, tuning
from models.choices import PORTABLE
from models.cpu import cpu_caps
from models.kv_cache import blocks_for
from models.loader import layer_weights, load

PREFILLS = (16, 64, 128, 512)
DECODE_BATCHES = (1, 8, 32)
HF_GOAL = 0.8  # ours <= 0.8x transformers on every row
FLOOR_GOALS = {16: 3.0, 128: 1.5, 512: 1.5}  # prefill tokens -> max ours / GEMM floor
STREAM_GOAL = 1.5  # decode b=1 <= 1.5x weight streaming time


@dataclass(slots=True)
class Row:
    dtype: str
    case: str
    ours_s: float
    hf_s: float
    floor_s: float
    floor_backend: str  # the fastest GEMM backend of the floor
    tokens: int  # tokens the case produces (prefill: prompt tokens; decode: batch size)

    @property
    def ratio(self) -> float:
        return self.ours_s / self.hf_s

    @property
    def floor_ratio(self) -> float:
        return self.ours_s / self.floor_s


def _medians(case: Case, repeats: int) -> dict[str, float]:
    fns = {"ours": case.ours, "hf": case.hf, **{f"floor:{k}": f for k, f in case.floors.items()}}
    return {k: ms / 1e3 for k, ms in probes.median_ms(fns, repeats).items()}


def _row(dtype: str, case: Case, repeats: int) -> Row:
    m = _medians(case, repeats)
    floors = {k.removeprefix("floor:"): v for k, v in m.items() if k.startswith("floor:")}
    best = min(floors, key=lambda k: floors[k])
    return Row(dtype, case.name, m["ours"], m["hf"], floors[best], best, case.tokens)


def bench_dtype(spec: str, dtype: str, repeats: int, threads: int) -> dict[str, Any]:
    model = load(spec, dtype=dtype, threads=threads, retune=True)  # kernels measured afresh
    probe = load(spec, dtype=dtype, kernel_choice=PORTABLE)  # plain weights for the floors
    tuned = tuning.load_or_measure(layer_weights(probe.ops), model.config, model.dtype, threads)
    hf = AutoModelForCausalLM.from_pretrained(model.path, dtype=model.dtype,
                                              attn_implementation="sdpa").eval()
    kv = model.new_kv_cache(blocks_for(512, BLOCK) * 40 + 64, BLOCK)
    for t in [*kv.keys.values(), *kv.values.values()]:
        t.normal_()  # NOTE: touch every page: untouched zero pages would make gathers cheap
    floor_w = FloorWeights.of(probe)
    cases = [prefill_case(model, hf, kv, floor_w, n) for n in PREFILLS]
    cases += [decode_case(model, hf, kv, floor_w, b) for b in DECODE_BATCHES]
    rows = [_row(dtype, c, repeats) for c in cases]
    ops = {c.name: [statistics.median(col) for col in zip(*[c.per_op() for _ in range(repeats)],
                                                         strict=True)] for c in cases}
    nbytes = streamed_bytes(probe)
    bw = copy_bandwidth(nbytes)
    return {"rows": rows, "per_op_s": ops, "kernels": tuned.choice.describe(),
            "kernel_choice": tuned.choice.to_dict(), "tuning_ms": tuned.timings_ms,
            "stream": {"weight_bytes": nbytes, "copy_bandwidth_bytes_s": bw,
                       "stream_s": nbytes / bw}}


def goals(rows: list[Row], streams: dict[str, dict[str, float]]) -> list[dict[str, Any]]:
    """Each goal of the bench, with its measured value and whether it is met."""
    out: list[dict[str, Any]] = []
    for r in rows:
        out.append({"goal": f"{r.dtype} {r.case}: ours <= {HF_GOAL}x transformers",
                    "value": r.ratio, "met": r.ratio <= HF_GOAL})
        n = int(r.case.split()[1]) if r.case.startswith("prefill") else 0
        limit = FLOOR_GOALS.get(n) or (1.5 if n >= 128 else None)
        if limit is not None:
            out.append({"goal": f"{r.dtype} {r.case}: ours <= {limit}x GEMM floor",
                        "value": r.floor_ratio, "met": r.floor_ratio <= limit})
        if r.case == "decode b=1":
            ratio = r.ours_s / streams[r.dtype]["stream_s"]
            out.append({"goal": f"{r.dtype} decode b=1: ours <= {STREAM_GOAL}x weight streaming",
                        "value": ratio, "met": ratio <= STREAM_GOAL})
    return out


def _print(rows: list[Row], per_dtype: dict[str, dict[str, Any]], threads: int) -> None:
    print(f"CPU: {capability_line()}; {threads} thread(s); native kernels {native.note()}")
    for dt, res in per_dtype.items():
        s = res["stream"]
        print(f"{dt}: kernels {res['kernels']}; decode step streams "
              f"{s['weight_bytes'] / 1e6:.0f} MB of weights, copy bandwidth "
              f"{s['copy_bandwidth_bytes_s'] / 1e9:.1f} GB/s (read + write) -> "
              f"{s['stream_s'] * 1e3:.1f} ms")
    print()
    print_table(["dtype", "case", "ours ms", "transformers ms", "ours/tf", "GEMM floor ms",
                 "ours/floor", f"ours tok/s ({threads} thr)"], "llrrrrrr",
                ([r.dtype, r.case, f"{r.ours_s * 1e3:.1f}", f"{r.hf_s * 1e3:.1f}",
                  f"{r.ratio:.2f}", f"{r.floor_s * 1e3:.1f}", f"{r.floor_ratio:.2f}",
                  f"{r.tokens / r.ours_s:.0f}"] for r in rows))


def _print_ops(names: list[str], per_dtype: dict[str, dict[str, Any]]) -> None:
    print("\nper-operator median ms (ours)")
    for dtype, res in per_dtype.items():
        print_table([f"{dtype} case", *names], "l" + "r" * len(names),
                    ([case, *(f"{t * 1e3:.2f}" for t in ts)]
                     for case, ts in res["per_op_s"].items()))


def run(spec: str, dtypes: list[str], repeats: int, threads: int, json_path: Path | None) -> dict:
    torch.set_num_threads(threads)
    per_dtype = {dt: bench_dtype(spec, dt, repeats, threads) for dt in dtypes}
    rows: list[Row] = [r for res in per_dtype.values() for r in res["rows"]]
    names = [o.name for o in load(spec, dtype=dtypes[0]).template.ops]
    _print(rows, per_dtype, threads)
    _print_ops(names, per_dtype)
    checked = goals(rows, {dt: res["stream"] for dt, res in per_dtype.items()})
    print("\ngoals")
    for g in checked:
        print(f"- {g['goal']}: {g['value']:.2f} {'met' if g['met'] else 'MISSED'}")
    result = {"model": spec, "threads": threads, "repeats": repeats, "cpu": capability_line(),
              "native": native.note(),
              "cpu_caps": asdict(cpu_caps()), "op_names": names, "goals": checked,
              "rows": [{**asdict(r), "ratio": r.ratio, "floor_ratio": r.floor_ratio}
                       for r in rows],
              "per_dtype": {dt: {k: v for k, v in res.items() if k != "rows"}
                            for dt, res in per_dtype.items()}}
    write_json(json_path, result)
    return result


def main(argv: list[str] | None = None) -> dict:
    p = parser("python -m benchmarks.models chain", __doc__)
    p.add_argument("--model", default="default")
    p.add_argument("--dtypes", default="bfloat16,float32")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    return run(a.model, a.dtypes.split(","), a.repeats, a.threads, a.json)
