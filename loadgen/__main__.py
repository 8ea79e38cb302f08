"""``python -m loadgen replay|bench|probe|stub`` (see ``loadgen/README.md``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from loadgen.bench_models_cli import add_parser as add_bench_models_parser
from loadgen.bursts import add_parser as add_bursts_parser
from loadgen.ceiling import add_parser as add_ceiling_parser
from loadgen.chaos_cli import add_parser as add_chaos_parser
from loadgen.client import DIALECTS
from loadgen.workload import parse_tenants

EXIT_INTERRUPTED = 130


def _replay(args: argparse.Namespace) -> int:
    from loadgen.plots import write_plots
    from loadgen.prompts import PromptBuilder, resolve_model_folder
    from loadgen.replay import ReplayConfig, replay
    from loadgen.report import format_markdown, resolve_slos, write_report

    config = ReplayConfig(
        url=args.url.rstrip("/"), tenants=tuple(parse_tenants(args.tenant)), model=args.model,
        duration_s=args.duration, drain_timeout_s=args.drain_timeout,
        request_timeout_s=args.request_timeout, admin_key=args.admin_key,
        dialect=args.dialect, warmup_requests=args.warmup, progress=args.progress,
        handle_signals=True)
    builder = PromptBuilder.from_folder(resolve_model_folder(args.tokenizer))
    result = asyncio.run(replay(config, builder.text))
    slo_s = args.slo_ms / 1000 if args.slo_ms is not None else None
    report = write_report(result, args.out, slo_s)
    if not args.no_plots:
        write_plots(result, args.out, {k: v for k, (v, _) in resolve_slos(result, slo_s).items()})
    print(format_markdown(report))
    print(f"wrote {args.out}/report.json, report.md, requests.jsonl"
          + ("" if args.no_plots else " and plots"), file=sys.stderr)
    if result.interrupted:
        return EXIT_INTERRUPTED
    return 0 if any(r.ok for r in result.records) else 1


def _bench(args: argparse.Namespace) -> int:
    from loadgen.bench import BenchConfig, run_bench
    from loadgen.sweep import parse_sweep

    tpot_ms, tpot_factor = _tpot_slo(args.tpot_slo_ms)
    config = BenchConfig.for_recipe(
        out=args.out or Path("bench-results") / datetime.now().strftime("%Y%m%d-%H%M%S"),
        recipe=args.recipe, interactive=args.interactive,
        serve_cmd=tuple(shlex.split(args.serve_cmd)) if args.serve_cmd else None,
        policies=None if args.policies is None else _names(args.policies),
        peers=_names(args.peers), model=args.model,
        devices=args.devices, dtype=args.dtype, max_model_len=args.max_model_len,
        batch=args.batch, tail_s=args.tail, slo_ms=args.slo_ms,
        alone_policy=args.alone_policy, slo_factor=args.slo_factor,
        max_requests=args.max_requests, span_s=args.span_s, tpot_slo_ms=tpot_ms,
        tpot_slo_factor=tpot_factor,
        serve_args=tuple(args.serve_arg), ready_timeout_s=args.ready_timeout,
        no_cache_policies=_no_cache(args.no_cache_runs),
        peer_ready_timeout_s=args.peer_ready_timeout, drain_timeout_s=args.drain_timeout,
        request_timeout_s=args.request_timeout, warmup_requests=args.warmup,
        sweep=parse_sweep(args.sweep) if args.sweep else None)
    doc = run_bench(config, "python -m loadgen " + shlex.join(sys.argv[1:]))
    print((config.out / "bench.md").read_text())
    print(f"wrote {config.out}/bench.json, bench.md, plots and runs/", file=sys.stderr)
    if doc["interrupted"]:
        return EXIT_INTERRUPTED
    failed = [p for p in (*config.policies, *(n for n, _ in config.sweep))
              if doc["runs"].get(p, {}).get("status") != "ok"]
    return 1 if failed else 0


def _spec_bench(args: argparse.Namespace) -> int:
    from loadgen.specbench import SpecBenchConfig, run_spec_bench

    config = SpecBenchConfig(
        out=args.out or Path("bench-results") / datetime.now().strftime("spec-%Y%m%d-%H%M%S"),
        model=args.model, peer_model_dir=args.peer_model_dir, peers=_names(args.peers),
        spec=args.speculative_config, workloads=_names(args.workloads),
        requests=args.requests, repeats=args.repeats, max_tokens=args.max_tokens,
        devices=args.devices, dtype=args.dtype, serve_args=tuple(args.serve_arg))
    doc = run_spec_bench(config, "python -m loadgen " + shlex.join(sys.argv[1:]))
    print((config.out / "spec-bench.md").read_text())
    print(f"wrote {config.out}/spec-bench.json, spec-bench.md", file=sys.stderr)
    return 0 if doc["runs"].get("slicegate", {}).get("status") == "ok" else 1


def _probe(args: argparse.Namespace) -> int:
    from loadgen.overhead import ProbeConfig, markdown, run_probe

    if not args.overhead:
        raise ValueError("say what to probe: --overhead")
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    out = args.out or Path("bench-results") / f"overhead-{stamp}"
    config = ProbeConfig(
        out=out, model=args.model, dtype=args.dtype, devices=args.devices,
        prompt_tokens=_ints(args.prompt_tokens), max_tokens=_ints(args.max_tokens),
        requests=args.requests, rounds=args.rounds, threads=args.threads)
    if args.serve_cmd:
        config = replace(config, serve_cmd=tuple(shlex.split(args.serve_cmd)))
    summary = run_probe(config)
    summary["command"] = "python -m loadgen " + shlex.join(sys.argv[1:])
    text = markdown(summary)
    (out / "overhead.json").write_text(json.dumps(summary, indent=1))
    (out / "overhead.md").write_text(text + "\n")
    print(text)
    print(f"wrote {out}/overhead.json and overhead.md", file=sys.stderr)
    return 0


def _tpot_slo(text: str | None) -> tuple[float | None, float | None]:
    """``--tpot-slo-ms``: ``60`` (ms) or ``2x`` (times the alone run's TPOT p50)."""
    if text is None:
        return None, None
    try:
        if text.strip().lower().endswith("x"):
            return None, float(text.strip()[:-1])
        return float(text), None
    except ValueError:
        raise ValueError(f"--tpot-slo-ms: expected milliseconds (60) or a factor of the alone "
                         f"TPOT (2x), got {text!r}") from None


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip() and n.strip() != "none")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m loadgen",
        description="Drive an OpenAI-compatible server over HTTP: replay tenants' workloads "
                    "(replay), run slicegate's policies and peer servers side by side (bench), "
                    "or start a model-free server for dry runs (stub). Recipes: "
                    "loadgen/README.md.")
    sub = p.add_subparsers(dest="cmd", required=True)
    _replay_parser(sub.add_parser("replay", help="replay tenants' workloads against a server"))
    _bench_parser(sub.add_parser("bench", help="slicegate policies and peers side by side"))
    add_bench_models_parser(sub.add_parser(
        "bench-models", help="two models on one machine: one slicegate, a static split, "
                             "two vLLM servers"))
    _probe_parser(sub.add_parser("probe", help="what the serving path adds to a request"))
    _spec_bench_parser(sub.add_parser("spec-bench", help="speculative decoding on and off, "
                                                         "and peers, on code edits and chat"))
    add_chaos_parser(sub.add_parser("chaos", help="overload, faults, dropped streams, "
                                                  "fuzzing and soak, each against its server"))
    add_bursts_parser(sub.add_parser("bursts", help="a run's TTFT by the arrivals just "
                                                    "before each request, and its token gaps"))
    add_ceiling_parser(sub.add_parser("ceiling", help="the most of a workload's requests that "
                                                      "any server could start within a TTFT SLO "
                                                      "on this machine (an upper bound)"))
    stub = sub.add_parser("stub", help="a model-free OpenAI-compatible server for dry runs",
                          add_help=False)
    stub.set_defaults(fn=None)
    return p


def _replay_parser(r: argparse.ArgumentParser) -> None:
    r.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    r.add_argument("--model", default=None, help="default: the first of /v1/models")
    r.add_argument("--tenant", action="append", required=True, metavar="NAME:KEY:SOURCE[:OPTS]",
                   help="repeatable; SOURCE: a trace path or synthetic-coding with ,key=value "
                        "options, rate=R,prompt=P,gen=G or concurrency=C,prompt=P,gen=G; "
                        "OPTS: priority=N, slo_ms=M")
    r.add_argument("--out", type=Path, required=True, help="folder for the report and plots")
    r.add_argument("--tokenizer", default="default",
                   help="model folder or spec whose tokenizer sizes the prompts (default: default)")
    r.add_argument("--duration", type=float, default=None, help="stop sending after S seconds")
    r.add_argument("--drain-timeout", type=float, default=60.0,
                   help="after an early stop, seconds in-flight requests may still take")
    r.add_argument("--request-timeout", type=float, default=600.0)
    r.add_argument("--slo-ms", type=float, default=None,
                   help="TTFT SLO for tenants without slo_ms= (default: the server's, if any)")
    r.add_argument("--admin-key", default="", help="slicegate admin key: device busy/idle report")
    r.add_argument("--dialect", choices=DIALECTS, default="vllm",
                   help="how to ask for exact output lengths: vllm (also slicegate: ignore_eos, "
                        "min_tokens, priority), transformers (generation_config), openai (none)")
    r.add_argument("--warmup", type=int, default=0,
                   help="warm-up requests per tenant before the clock starts")
    r.add_argument("--no-plots", action="store_true")
    r.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress line (default: on a terminal)")
    r.set_defaults(fn=_replay)


def _no_cache(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    return () if text.strip() == "none" else tuple(p for p in text.split(",") if p)


def _bench_parser(b: argparse.ArgumentParser) -> None:
    from loadgen.recipes import RECIPES, SATURATING_BATCH, TRACE_SHAPE

    b.add_argument("--policies", default=None,
                   help="default: fcfs,priority,static,slice (saturating: slice)")
    b.add_argument("--peers", default="vllm", help="vllm,transformers or none (default: vllm)")
    b.add_argument("--model", default="default", help="slicegate --model; also the peers' folder")
    b.add_argument("--devices", default=None)
    b.add_argument("--dtype", default="bfloat16")
    b.add_argument("--max-model-len", type=int, default=2048)
    b.add_argument("--interactive", default=None,
                   help="interactive tenant SOURCE (default: the Azure code trace from "
                        "$SLICEGATE_TRACES, see docs/traces.md, with " + TRACE_SHAPE + ")")
    b.add_argument("--recipe", choices=tuple(RECIPES), default="default",
                   help="the interactive trace's shape when --interactive is not given: "
                        "default (first 300 requests, bursty) or strict (a steadier window "
                        "at 0.5x, tight SLO), as in `python -m benchmarks.scheduler policies`; "
                        "mooncake: a window of the Mooncake conversation trace, its prompts "
                        "sharing blocks as its hash_ids say (adds a slice-no-cache run); "
                        "saturating: issue 41's mix, 279 requests in 240 s beside a batch "
                        f"tenant {SATURATING_BATCH}, slice against vLLM, SLO 500 ms, "
                        "the stream alone under slice first (its TPOT alone)")
    b.add_argument("--max-requests", type=int, default=None,
                   help="cut the recipe's trace to its first N requests (a short run)")
    b.add_argument("--span-s", type=float, default=None,
                   help="cut the recipe's trace to its first S seconds of replay (a short run)")
    b.add_argument("--tpot-slo-ms", default=None,
                   help="write the interactive tenant's tpot_slo_ms: MS, or Nx (N x its TPOT "
                        "p50 alone); default: not written")
    b.add_argument("--no-cache-runs", default=None,
                   help="policies run once more with --no-prefix-cache, or none (default: "
                        "slice under --recipe mooncake, else none)")
    b.add_argument("--batch", default=None,
                   help="batch tenant SOURCE, or none: the interactive tenant alone in "
                        "every run (default: concurrency=16,prompt=512,gen=64; saturating: "
                        f"{SATURATING_BATCH})")
    b.add_argument("--tail", type=float, default=2.0,
                   help="mixed runs send for the interactive trace's span + this many seconds")
    b.add_argument("--slo-ms", type=float, default=None,
                   help="interactive TTFT SLO (default: measured: p90 TTFT alone, see below; "
                        "saturating: 500)")
    b.add_argument("--alone-policy", default=None,
                   help="policy of the interactive-alone run that sets the SLO (default: "
                        "static, saturating: slice; slice: the floor mixed runs are "
                        "compared with)")
    b.add_argument("--slo-factor", type=float, default=1.0,
                   help="SLO = this x the alone run's p90 TTFT (default: %(default)s)")
    b.add_argument("--serve-cmd", default=None,
                   help="command that starts slicegate (default: PYTHON -m gateway serve)")
    b.add_argument("--serve-arg", action="append", default=[],
                   help="extra flag for every slicegate run (repeatable)")
    b.add_argument("--sweep", default=None, metavar="NAME=FLAGS;...|granularity",
                   help="slice runs with flags of their own, e.g. 'lpg2=--layers-per-group 2;"
                        "adaptive=--layer-groups 2,10'; granularity: layers per operator 2, "
                        "5, 10, 30 and adaptive 2,10; chunks: --max-num-batched-tokens 256 "
                        "to 2048 (loadgen/sweep.py)")
    b.add_argument("--ready-timeout", type=float, default=600.0)
    b.add_argument("--peer-ready-timeout", type=float, default=1800.0)
    b.add_argument("--drain-timeout", type=float, default=60.0)
    b.add_argument("--request-timeout", type=float, default=300.0)
    b.add_argument("--warmup", type=int, default=2,
                   help="warm-up requests per tenant and run (default: 2)")
    b.add_argument("--out", type=Path, default=None,
                   help="output folder (default: bench-results/DATE-TIME)")
    b.set_defaults(fn=_bench)


def _spec_bench_parser(p: argparse.ArgumentParser) -> None:
    from loadgen.specbench import DEFAULT_SPEC

    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default: bench-results/spec-DATE-TIME)")
    p.add_argument("--model", default="default", help="slicegate's --model")
    p.add_argument("--peer-model-dir", default=None,
                   help="the model folder the peers serve (none given: no peers)")
    p.add_argument("--peers", default="vllm", help="comma-separated: vllm, or none")
    p.add_argument("--speculative-config", default=DEFAULT_SPEC, metavar="JSON",
                   help="for slicegate and the peers (vLLM's flag)")
    p.add_argument("--workloads", default="code-edit,chat", help="code-edit, chat")
    p.add_argument("--requests", type=int, default=6, help="prompts per workload")
    p.add_argument("--repeats", type=int, default=3, help="each prompt, each mode, this often")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--devices", default="cpu:0")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--serve-arg", action="append", default=[],
                   help="an extra flag for slicegate (repeat it)")
    p.set_defaults(fn=_spec_bench)


def _probe_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--overhead", action="store_true",
                   help="per-request overhead of slicegate's serving path against the operator "
                        "chain called directly (python -m models direct), at idle")
    p.add_argument("--model", default="default")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--devices", default="cpu:0", help="slicegate --devices (default: one)")
    p.add_argument("--prompt-tokens", default="16,128")
    p.add_argument("--max-tokens", default="1,16")
    p.add_argument("--requests", type=int, default=20, help="per case, mode and round")
    p.add_argument("--rounds", type=int, default=2, help="direct and server rounds, interleaved")
    p.add_argument("--threads", type=int, default=None,
                   help="intra-op threads of the server's CPU devices (its --cpu-threads) and "
                        "of the direct runs (default: the server's, the cores split between "
                        "its CPU devices)")
    p.add_argument("--serve-cmd", default=None,
                   help="command that starts slicegate (default: PYTHON -m gateway serve)")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default: bench-results/overhead-DATE-TIME)")
    p.set_defaults(fn=_probe)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["stub"]:
        from loadgen.stub import main as stub_main
        return stub_main(argv[1:])
    args = _parser().parse_args(argv)
    try:
        return int(args.fn(args))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
