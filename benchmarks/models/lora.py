"""`python -m benchmarks.models lora`: output tok/s of a batch mixing LoRA adapters and the base.

Decode steps of one batch of `--seqs` sequences on the model (each with a
`--context`-token prompt prefilled before the clock starts): "base", every
sequence on the base model, against "mixed", the same batch with `--adapters`
adapters (random non-zero weights, rank `--rank`, every q/k/v/o/gate/up/down
projection) each on 2 sequences and the rest on the base. Each repeat times
`--steps` decode steps of each batch in turn (interleaved, the same positions
every repeat); the table gives medians, and the goal is mixed >= 0.8x base.
With `--layouts`, the low-rank products of one layer in three layouts first
(`benchmarks/models/lora_layouts.py`): why `models.lora` runs the one it does.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from benchmarks.harness import machine, machine_line, parser, print_table, write_json
from benchmarks.models.lora_layouts import compare
from models.batch import SeqSpec, build_batch
from models.generate import run_chain
from models.kv_cache import KVCache, blocks_for
from models.loader import Model, load
from models.lora import LoraAdapter, LoraWeights
from models.lora.adapter import TARGETS
from models.sampling_params import SamplingParams

BLOCK = 16
GREEDY = SamplingParams(temperature=0.0, max_tokens=1 << 20)


def random_adapter(model: Model, name: str, rank: int, seed: int,
                   targets: tuple[str, ...] = TARGETS) -> LoraAdapter:
    """An adapter of `targets` with A, B ~ N(0, 1/sqrt(fan-in)) (non-zero)."""
    g = torch.Generator().manual_seed(seed)
    shapes = model.lora_shapes()
    layers = []
    for _ in range(model.num_layers):
        layer = {}
        for t in targets:
            fin, fout = shapes[t]
            a = torch.randn(rank, fin, generator=g) / fin ** 0.5
            b = torch.randn(fout, rank, generator=g) / rank ** 0.5
            layer[t] = LoraWeights(a.to(model.dtype), b.to(model.dtype))
        layers.append(layer)
    return LoraAdapter(name, model.path, rank, 2.0, targets, tuple(layers), model.dtype)


class Decoder:
    """`num_seqs` sequences prefilled on one KV cache, decoded a step at a time."""

    def __init__(self, model: Model, adapters: list[str | None], context: int,
                 steps: int) -> None:
        self.model, self.adapters, self.context = model, adapters, context
        total = context + steps
        self.kv: KVCache = model.new_kv_cache(len(adapters) * blocks_for(total, BLOCK), BLOCK)
        self.tables = [self.kv.allocator.allocate(blocks_for(total, BLOCK)) for _ in adapters]
        g = torch.Generator().manual_seed(0)
        prompts = torch.randint(100, model.config.vocab_size - 100, (len(adapters), context),
                                generator=g).tolist()
        self.last = [int(t) for t in self._step(prompts, 0)]

    def _step(self, feeds: list[list[int]], past: int) -> torch.Tensor:
        seqs = [SeqSpec(f"r{i}", f, past, t, sample=True, sampling=GREEDY, adapter=a)
                for i, (f, t, a) in enumerate(zip(feeds, self.tables, self.adapters,
                                                  strict=True))]
        return run_chain(self.model, build_batch(seqs, BLOCK, self.model.device), self.kv)

    def decode(self, steps: int) -> float:
        """Seconds of `steps` decode steps from the end of the prompts."""
        tokens = self.last
        t0 = time.perf_counter()
        for i in range(steps):
            tokens = self._step([[t] for t in tokens], self.context + i).tolist()
        return time.perf_counter() - t0


def measure(model: Model, num_seqs: int, num_adapters: int, rank: int,
            targets: tuple[str, ...], context: int, steps: int, repeats: int) -> dict[str, Any]:
    for i in range(num_adapters):
        model.adapters.add(random_adapter(model, f"lora{i}", rank, i + 1, targets))
    mixed: list[str | None] = [f"lora{i // 2}" if i < 2 * num_adapters else None
                               for i in range(num_seqs)]
    runs = {"base": Decoder(model, [None] * num_seqs, context, steps),
            "mixed": Decoder(model, mixed, context, steps)}
    for d in runs.values():  # warm-up: every row count's primitives built
        d.decode(steps)
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(repeats):
        for name, d in runs.items():
            times[name].append(d.decode(steps))
    tok_s = {k: num_seqs * steps / statistics.median(v) for k, v in times.items()}
    return {"seqs": num_seqs, "adapters": num_adapters, "rank": rank, "targets": targets,
            "context": context,
            "steps": steps, "repeats": repeats, "mixed_rows": mixed, "times_s": times,
            "tok_s": tok_s, "ratio": tok_s["mixed"] / tok_s["base"],
            "adapter_mib": model.adapters.memory_bytes() / 2**20}


def main(argv: list[str] | None = None) -> None:
    p = parser("python -m benchmarks.models lora", __doc__)
    p.add_argument("--model", default="default")
    p.add_argument("--dtype", default=None)
    p.add_argument("--seqs", type=int, default=10)
    p.add_argument("--adapters", type=int, default=4)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--targets", default=",".join(TARGETS),
                   help=f"comma-separated projections the adapters adapt, of {TARGETS}")
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--steps", type=int, default=16, help="decode steps timed per repeat")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--layouts", action="store_true", help="time three layouts of the products")
    args = p.parse_args(argv)
    if args.seqs < 2 * args.adapters:
        raise ValueError(f"--seqs {args.seqs} < 2 per adapter x {args.adapters}")
    targets = tuple(t for t in TARGETS if t in args.targets.split(","))
    if not targets or set(args.targets.split(",")) - set(TARGETS):
        raise ValueError(f"--targets {args.targets!r}: name projections of {TARGETS}")
    torch.set_num_threads(args.threads)
    model = load(args.model, dtype=args.dtype, threads=args.threads)
    print(machine_line())
    layouts = None
    if args.layouts:
        shapes = {k: model.lora_shapes()[k] for k in ("q", "o", "gate", "up", "down")}
        shapes["q"] = (shapes["q"][0], sum(model.lora_shapes()[k][1] for k in "qkv"))
        layouts = compare(shapes, args.seqs, args.adapters, args.rank, 200)
        print_table(["layout", "one layer's products, decode (us)"], "lr",
                    [[k, f"{v * 1e6:.0f}"] for k, v in layouts.items()])
    r = measure(model, args.seqs, args.adapters, args.rank, targets, args.context, args.steps,
                args.repeats)
    print_table(["batch", "rows", "output tok/s (median)"], "llr", [
        ["base", f"{args.seqs} base", f"{r['tok_s']['base']:.1f}"],
        ["mixed", f"{args.adapters} adapters x 2 + {args.seqs - 2 * args.adapters} base",
         f"{r['tok_s']['mixed']:.1f}"]])
    print(f"mixed / base: {r['ratio']:.3f}x (goal >= 0.8x); adapters take "
          f"{r['adapter_mib']:.1f} MiB ({model.dtype}, rank {args.rank}, {'/'.join(targets)})")
    write_json(args.json, {**machine(), "model": args.model, "dtype": str(model.dtype),
                           "threads": args.threads, "layouts_s": layouts, **r})
