"""`python -m loadgen chaos`: its flags and its run (see loadgen/chaos.py)."""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from loadgen.chaos import SCENARIOS, ChaosConfig


def add_parser(c: argparse.ArgumentParser) -> None:
    c.add_argument("--json", action="store_true", help="print the JSON document (else a table)")
    c.add_argument("--short", action="store_true",
                   help="the test run's variant: tiny model, seconds per scenario")
    c.add_argument("--scenarios", default=",".join(SCENARIOS),
                   help=f"comma-separated, from {','.join(SCENARIOS)}")
    c.add_argument("--model", help="model spec (default: default; --short: tiny-random)")
    c.add_argument("--devices", help="server devices (default: the server's)")
    c.add_argument("--dtype")
    c.add_argument("--max-model-len", type=int)
    c.add_argument("--serve-cmd", help="command that starts slicegate (default: PYTHON -m "
                                       "gateway serve)")
    c.add_argument("--slo-ms", type=float, help="interactive tenants' TTFT SLO (default 1000)")
    c.add_argument("--overload-factor", type=float, help="x measured capacity (default 10)")
    c.add_argument("--overload-s", type=float, help="overload duration (default 60)")
    c.add_argument("--capacity-rps", type=float, help="skip measuring capacity: use this")
    c.add_argument("--fault-rate", type=float, help="faults scenario's rate (default 0.01)")
    c.add_argument("--drops", type=int, help="streams to drop (default 1000)")
    c.add_argument("--fuzz-cases", type=int, help="schemathesis cases (default 10000)")
    c.add_argument("--soak-s", type=float, help="soak duration (default 1800)")
    c.add_argument("--out", type=Path, help="output folder (default: bench-results/chaos-DATE)")
    c.set_defaults(fn=run)


_OVERRIDES = ("model", "devices", "dtype", "max_model_len", "slo_ms", "overload_factor",
              "overload_s", "capacity_rps", "fault_rate", "drops", "fuzz_cases", "soak_s")


def config_from_args(args: argparse.Namespace) -> ChaosConfig:
    out = args.out or Path("bench-results") / f"chaos-{datetime.now():%Y%m%d-%H%M%S}"
    cfg = ChaosConfig.short(out) if args.short else ChaosConfig(out)
    names = tuple(s.strip() for s in args.scenarios.split(",") if s.strip())
    unknown = set(names) - set(SCENARIOS)
    if unknown or not names:
        raise ValueError(f"unknown scenario(s) {', '.join(sorted(unknown))}: use "
                         f"{', '.join(SCENARIOS)}")
    changes = {k: getattr(args, k) for k in _OVERRIDES if getattr(args, k) is not None}
    if args.serve_cmd:
        changes["serve_cmd"] = tuple(shlex.split(args.serve_cmd))
    return replace(cfg, scenarios=names, **changes)


def run(args: argparse.Namespace) -> int:
    from loadgen.chaos_report import markdown
    from loadgen.chaos_scenarios import run_chaos, write
    from loadgen.prompts import PromptBuilder, resolve_model_folder

    cfg = config_from_args(args)
    if not cfg.serve_cmd:
        cfg = replace(cfg, serve_cmd=(sys.executable, "-m", "gateway", "serve"))
    builder = PromptBuilder.from_folder(resolve_model_folder(cfg.model))
    rows = asyncio.run(run_chaos(cfg, builder.text))
    doc = write(cfg, rows, "python -m loadgen chaos " + shlex.join(sys.argv[2:]))
    print(json.dumps(doc, indent=2, default=str) if args.json else markdown(rows))
    print(f"wrote {cfg.out}/chaos.json and chaos.md", file=sys.stderr)
    return 0 if doc["all_met"] else 1
