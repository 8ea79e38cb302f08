"""`python -m loadgen bench-models`: its flags and its run (see loadgen/bench_models.py)."""

from __future__ import annotations

import argparse
import shlex
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from loadgen.bench_models import LAYOUTS, ModelsBenchConfig, run_models_bench
from loadgen.recipes import SATURATING_BATCH

EXIT_INTERRUPTED = 130


def add_parser(b: argparse.ArgumentParser) -> None:
    b.add_argument("--layouts", default=",".join(LAYOUTS),
                   help="slice (one slicegate, --model chat=M --model batch=M), static (one "
                        "slicegate per model, one core each), vllm (two vLLM CPU servers); "
                        "default: %(default)s")
    b.add_argument("--model", default="default", help="both instances' spec; vLLM's folder")
    b.add_argument("--devices", default="cpu:0,cpu:1",
                   help="two devices: chat's and batch's in the static split (default: "
                        "%(default)s); the slice layout gets both")
    b.add_argument("--dtype", default="bfloat16")
    b.add_argument("--max-model-len", type=int, default=2048)
    b.add_argument("--interactive", default=None,
                   help="the chat tenant's SOURCE (default: the saturating recipe's window of "
                        "the Azure code trace, see loadgen/README.md)")
    b.add_argument("--max-requests", type=int, default=None,
                   help="cut the recipe's trace to its first N requests (a short run)")
    b.add_argument("--span-s", type=float, default=None,
                   help="cut the recipe's trace to its first S seconds of replay (a short run)")
    b.add_argument("--batch", default=SATURATING_BATCH,
                   help="the batch tenant's closed loop (default: %(default)s)")
    b.add_argument("--slo-ms", type=float, default=500.0,
                   help="the chat tenant's TTFT SLO (default: %(default)s)")
    b.add_argument("--policy", default="slice", help="slicegate --policy (default: slice)")
    b.add_argument("--tail", type=float, default=2.0,
                   help="the batch tenant sends until the last interactive arrival + this")
    b.add_argument("--no-pin", action="store_true",
                   help="leave the static split's and vLLM's servers unpinned")
    b.add_argument("--serve-cmd", default=None,
                   help="command that starts slicegate (default: PYTHON -m gateway serve)")
    b.add_argument("--serve-arg", action="append", default=[],
                   help="extra flag for every slicegate server (repeatable)")
    b.add_argument("--ready-timeout", type=float, default=600.0)
    b.add_argument("--peer-ready-timeout", type=float, default=1800.0)
    b.add_argument("--drain-timeout", type=float, default=60.0)
    b.add_argument("--request-timeout", type=float, default=300.0)
    b.add_argument("--warmup", type=int, default=2,
                   help="warm-up requests per tenant and layout (default: 2)")
    b.add_argument("--out", type=Path, default=None,
                   help="output folder (default: bench-results/models-DATE-TIME)")
    b.set_defaults(fn=run)


def config_from(args: argparse.Namespace) -> ModelsBenchConfig:
    """The bench the flags describe."""
    devices = tuple(d.strip() for d in args.devices.split(",") if d.strip())
    if len(devices) != 2:
        raise ValueError(f"--devices: give two devices, got {args.devices!r}")
    optional: dict[str, Any] = {"serve_cmd": tuple(shlex.split(args.serve_cmd))
                                if args.serve_cmd else None}
    return ModelsBenchConfig(
        out=args.out or Path("bench-results") / datetime.now().strftime("models-%Y%m%d-%H%M%S"),
        layouts=tuple(n.strip() for n in args.layouts.split(",") if n.strip()),
        model=args.model, devices=(devices[0], devices[1]), dtype=args.dtype,
        max_model_len=args.max_model_len, interactive=args.interactive,
        max_requests=args.max_requests, span_s=args.span_s, batch=args.batch,
        slo_ms=args.slo_ms,
        policy=args.policy, tail_s=args.tail, pin=not args.no_pin,
        serve_args=tuple(args.serve_arg), ready_timeout_s=args.ready_timeout,
        peer_ready_timeout_s=args.peer_ready_timeout, drain_timeout_s=args.drain_timeout,
        request_timeout_s=args.request_timeout, warmup_requests=args.warmup,
        **{k: v for k, v in optional.items() if v is not None})


def run(args: argparse.Namespace) -> int:
    config = config_from(args)
    doc = run_models_bench(config, "python -m loadgen " + shlex.join(sys.argv[1:]))
    print((config.out / "bench.md").read_text())
    print(f"wrote {config.out}/bench.json, bench.md and runs/", file=sys.stderr)
    if doc["interrupted"]:
        return EXIT_INTERRUPTED
    return 0 if all(r["status"] == "ok" for r in doc["runs"].values()) else 1
