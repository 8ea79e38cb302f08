"""`python -m benchmarks.gateway features`: time per output token with the API's features.

One server (`python -m gateway serve`, the default model) answers streamed chat requests,
one at a time, through the official `openai` client: plain, with a JSON schema
(`response_format` json_schema), with `logprobs` and `top_logprobs: 5`, and with `n: 4`.
Every request asks for exactly `--tokens` output tokens (`min_tokens` = `max_tokens`; the
schema is an array of at least 100 strings, so the grammar never completes first).
The variants are interleaved round by round, so a drift of the machine falls on each
alike; a request's TPOT is (last chunk - first chunk) / (tokens per choice - 1), and the
table gives each variant's median over the rounds and its ratio to the plain median.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openai import OpenAI

from benchmarks.harness import machine, machine_line, parser, print_table, write_json
from loadgen.servers import RunningServer, ServerSpec, default_serve_cmd, free_port

PROMPT = "List the names of files a Python project usually has, one per item."
SCHEMA = {"type": "object", "properties": {"files": {
    "type": "array", "items": {"type": "string"}, "minItems": 100}}, "required": ["files"]}


@dataclass(frozen=True, slots=True)
class Variant:
    name: str
    extra: dict[str, Any]  # request fields beside the prompt and the lengths
    choices: int = 1


VARIANTS = (
    Variant("plain", {}),
    Variant("json_schema", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "files", "schema": SCHEMA, "strict": True}}}),
    Variant("logprobs-top5", {"logprobs": True, "top_logprobs": 5}),
    Variant("n=4", {"n": 4}, choices=4),
)


def tpot_s(client: OpenAI, model: str, v: Variant, tokens: int) -> float:
    """One streamed request's time per output token (seconds), over its choices."""
    first: float | None = None
    last = 0.0
    usage = None
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": PROMPT}], stream=True,
        max_tokens=tokens, temperature=0.0, stream_options={"include_usage": True},
        extra_body={"min_tokens": tokens, "ignore_eos": True}, **v.extra)
    for chunk in stream:
        if chunk.choices:
            first = time.perf_counter() if first is None else first
            last = time.perf_counter()
        if chunk.usage is not None:
            usage = chunk.usage
    assert first is not None and usage is not None, "the stream carried no tokens"
    per_choice = usage.completion_tokens / v.choices
    assert per_choice == tokens, f"{v.name}: {per_choice} tokens per choice, asked {tokens}"
    return (last - first) / (per_choice - 1)


def rounds(call: Callable[[Variant], float], variants: list[Variant], repeats: int
           ) -> dict[str, list[float]]:
    """`repeats` interleaved rounds of every variant (after one warm-up round)."""
    for v in variants:
        call(v)
    out: dict[str, list[float]] = {v.name: [] for v in variants}
    for _ in range(repeats):
        for v in variants:
            out[v.name].append(call(v))
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser("python -m benchmarks.gateway features", __doc__)
    p.add_argument("--model", default="default", help="the served model (default: default)")
    p.add_argument("--tokens", type=int, default=48, help="output tokens per choice")
    p.add_argument("--repeats", type=int, default=5, help="rounds after the warm-up")
    p.add_argument("--only", default=None, metavar="NAMES",
                   help="comma-separated variants beside plain (default: all)")
    p.add_argument("--log", type=Path, default=Path("bench-results/features-server.log"))
    args = p.parse_args(argv)
    wanted = None if args.only is None else {"plain", *args.only.split(",")}
    variants = [v for v in VARIANTS if wanted is None or v.name in wanted]
    port = free_port()
    spec = ServerSpec("slicegate", (*default_serve_cmd(), "--model", args.model, "--host",
                                    "127.0.0.1", "--port", str(port)), port)
    for name in ("httpx", "httpx2"):  # the openai client logs a line per request otherwise
        logging.getLogger(name).setLevel(logging.WARNING)
    print(machine_line())
    with RunningServer(spec, args.log) as server:
        server.wait_ready()
        client = OpenAI(base_url=spec.url + "/v1", api_key="none", max_retries=0)
        model = client.models.list().data[0].id
        times = rounds(lambda v: tpot_s(client, model, v, args.tokens), variants,
                       args.repeats)
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    base = medians["plain"]
    print_table(("variant", "TPOT median (ms)", "runs (ms)", "x plain"), "lrrr",
                ((name, f"{m * 1e3:.1f}", " ".join(f"{t * 1e3:.1f}" for t in times[name]),
                  f"{m / base:.2f}") for name, m in medians.items()))
    result = {**machine(), "model": args.model, "tokens": args.tokens, "repeats": args.repeats,
              "tpot_s": times, "median_s": medians,
              "ratio_to_plain": {n: m / base for n, m in medians.items()}}
    write_json(args.json, result)
    return result
