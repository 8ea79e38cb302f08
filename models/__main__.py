"""`python -m models prepare|tune|generate|direct` (its benches: `python -m benchmarks.models`)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from models.sampling_params import SamplingParams


def _prepare(args: argparse.Namespace) -> None:
    from models.loader import resolve
    print(resolve(args.spec))


def _prompt_ids(tokenizer: Any, text: str, chat: bool) -> list[int]:
    if not chat:
        return list(tokenizer(text)["input_ids"])
    out = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                        add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def _generate(args: argparse.Namespace) -> None:
    from transformers import AutoTokenizer

    from models.generate import generate
    from models.loader import load

    model = load(args.model, dtype=args.dtype)
    tokenizer = AutoTokenizer.from_pretrained(model.path)
    ids = _prompt_ids(tokenizer, args.prompt, args.chat)
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            seed=args.seed, max_tokens=args.max_tokens,
                            stop_token_ids=() if args.ignore_eos else model.config.eos_token_ids)
    out = generate(model, ids, params)
    text = tokenizer.decode(out.token_ids, skip_special_tokens=True)
    if args.json:
        print(json.dumps({"token_ids": out.token_ids, "text": text,
                          "finish_reason": out.finish_reason}))
    else:
        print(text)


def _direct(args: argparse.Namespace) -> None:
    """Time requests through the operator chain directly: JSON cases in, JSON timings out."""
    import statistics

    import torch
    from transformers import AutoTokenizer

    from models.generate import timed_request
    from models.loader import load

    torch.set_num_threads(args.threads)
    model = load(args.model, dtype=args.dtype, threads=args.threads)
    tokenizer = AutoTokenizer.from_pretrained(model.path)
    out, warm = [], set()
    for case in json.loads(Path(args.cases).read_text()):
        ids = list(tokenizer.encode(case["prompt"], add_special_tokens=True))
        if (len(ids), case["max_tokens"]) not in warm:  # warm per shape, not primed per prompt
            timed_request(model, ids, case["max_tokens"])
            warm.add((len(ids), case["max_tokens"]))
        runs = [timed_request(model, ids, case["max_tokens"]) for _ in range(args.repeats)]
        out.append({**case, "prompt_tokens": len(ids), "ttft_s": [r[0] for r in runs],
                    "total_s": [r[1] for r in runs],
                    "median_ttft_s": statistics.median(r[0] for r in runs),
                    "median_total_s": statistics.median(r[1] for r in runs)})
    print(json.dumps({"model": args.model, "dtype": str(model.dtype), "threads": args.threads,
                      "kernels": model.kernels.describe(), "cases": out}))


def _tune(args: argparse.Namespace) -> None:
    from models import tuning
    from models.choices import PORTABLE
    from models.loader import layer_weights, load

    model = load(args.model, dtype=args.dtype, kernel_choice=PORTABLE)
    tuned = tuning.load_or_measure(layer_weights(model.ops), model.config, model.dtype,
                                   args.threads, refresh=args.refresh)
    where = "from the cache" if tuned.from_cache else f"measured in {tuned.measured_s:.1f} s"
    print(f"{tuned.cpu}\nnative kernels {tuned.native}\n{model.dtype}, {args.threads} "
          f"thread(s), {where}: {tuned.choice.describe()}")
    if args.json:
        print(json.dumps({"choice": tuned.choice.to_dict(), "timings_ms": tuned.timings_ms}))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m models", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    pr = sub.add_parser("prepare", help="prepare a model folder and print its path")
    pr.add_argument("spec", nargs="?", default="default")
    pr.set_defaults(fn=_prepare)
    t = sub.add_parser("tune", help="measure (or show the cached) fastest kernels on this CPU")
    t.add_argument("--model", default="default")
    t.add_argument("--dtype", choices=["float32", "bfloat16"], default=None)
    t.add_argument("--threads", type=int, default=1,
                   help="intra-op threads (a server's CPU executors: cores / CPU devices)")
    t.add_argument("--refresh", action="store_true", help="measure even when cached")
    t.add_argument("--json", action="store_true", help="also print the choice and timings")
    t.set_defaults(fn=_tune)
    g = sub.add_parser("generate", help="generate through the operator chain and paged KV")
    g.add_argument("--model", default="default")
    g.add_argument("--prompt", required=True)
    g.add_argument("--chat", action="store_true", help="apply the tokenizer's chat template")
    g.add_argument("--max-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--ignore-eos", action="store_true")
    g.add_argument("--dtype", choices=["float32", "bfloat16"], default=None,
                   help="default: the model folder's dtype")
    g.add_argument("--json", action="store_true", help="print token_ids and text as JSON")
    g.set_defaults(fn=_generate)
    d = sub.add_parser("direct", help="time requests through the operator chain, no server")
    d.add_argument("--model", default="default")
    d.add_argument("--dtype", choices=["float32", "bfloat16"], default=None)
    d.add_argument("--threads", type=int, default=1,
                   help="intra-op threads (a server's CPU executors: cores / CPU devices)")
    d.add_argument("--repeats", type=int, default=10)
    d.add_argument("--cases", required=True,
                   help='JSON file: [{"prompt": text, "max_tokens": n}, ...]')
    d.set_defaults(fn=_direct)
    return p


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    args = _parser().parse_args(argv)
    try:
        args.fn(args)
    except (ValueError, FileNotFoundError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
