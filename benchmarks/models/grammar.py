"""`python -m benchmarks.models grammar`: the grammar engines for structured output, measured.

For each engine (xgrammar, llguidance, outlines-core) and each of a few
realistic JSON schemas (`SCHEMAS`), with the model's own tokenizer: the compile
time of the schema (median of fresh compiles, no cache), then a greedy
generation by the model (chat prompt asking for the object) under the engine's
token mask, timing the mask fill at every step; the output must parse and
validate against the schema (`jsonschema`). The table gives per engine the
median and p90 fill per step over all steps of all schemas, the median compile
(schema to a matcher ready for its first mask), and how many outputs validated
and how many the grammar completed within `MAX_STEPS` tokens (an output cut
there, still inside an endless string, cannot validate).

Then the serving cost with the chosen engine (`models.grammar`): time per output
token of `models.generate` on one request with a JSON schema and the same
request without one, interleaved, side by side (goal: at most 1.15x).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import jsonschema
import torch

from benchmarks.harness import machine, machine_line, parser, print_table, write_json
from benchmarks.models.grammar_engines import ENGINES, Engine
from models.batch import SeqSpec, build_batch
from models.generate import chain_logits, generate
from models.grammar import Grammars, GrammarSpec
from models.kv_cache import blocks_for
from models.loader import Model, load
from models.sampling_params import SamplingParams

BLOCK = 16
MAX_STEPS = 160
SCHEMAS: dict[str, tuple[str, dict[str, Any]]] = {
    "person": ("a person named Ada Lovelace, born 1815", {
        "type": "object", "properties": {
            "name": {"type": "string"}, "age": {"type": "integer"},
            "email": {"type": "string"}},
        "required": ["name", "age", "email"], "additionalProperties": False}),
    "product": ("a laptop for sale", {
        "type": "object", "properties": {
            "title": {"type": "string"}, "price": {"type": "number"},
            "currency": {"enum": ["USD", "EUR", "GBP"]},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
            "size": {"type": "object", "properties": {
                "width_cm": {"type": "number"}, "depth_cm": {"type": "number"}},
                "required": ["width_cm", "depth_cm"], "additionalProperties": False}},
        "required": ["title", "price", "currency", "tags", "size"],
        "additionalProperties": False}),
    "events": ("two meetings next week", {
        "type": "object", "properties": {"events": {
            "type": "array", "minItems": 1, "maxItems": 3, "items": {
                "type": "object", "properties": {
                    "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
                    "title": {"type": "string"}, "online": {"type": "boolean"}},
                "required": ["date", "title", "online"], "additionalProperties": False}}},
        "required": ["events"], "additionalProperties": False}),
    "ticket": ("a bug report about a login page", {
        "type": "object", "properties": {
            "id": {"type": "integer", "minimum": 1},
            "severity": {"enum": ["low", "medium", "high", "critical"]},
            "summary": {"type": "string", "maxLength": 80},
            "assignee": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "labels": {"type": "array", "items": {"enum": ["ui", "auth", "backend"]}}},
        "required": ["id", "severity", "summary"], "additionalProperties": False}),
}


def prompt_ids(tokenizer: Any, what: str, schema: dict[str, Any]) -> list[int]:
    messages = [{"role": "user", "content": f"Reply with JSON only: {what}. "
                                            f"JSON schema: {json.dumps(schema)}"}]
    ids: list[int] = tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                   tokenize=True, return_dict=False)
    return ids


def _banned(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    # bitmask: [1, W] int32 -> [V] bool, True = not allowed
    bits = torch.arange(32, dtype=torch.int32)  # [32]
    allowed = (bitmask[0, :, None] >> bits) & 1  # [W, 32]
    return allowed.flatten()[:vocab] == 0


def constrained_run(model: Model, tokenizer: Any, engine: Engine, compiled: object,
                    prompt: list[int]) -> tuple[str, list[float]]:
    """Greedy generation under `compiled`'s mask: (text, seconds of each mask fill)."""
    vocab = model.config.vocab_size
    matcher = engine.matcher(compiled)
    bitmask = torch.zeros(1, (vocab + 31) // 32, dtype=torch.int32)  # [1, W]
    kv = model.new_kv_cache(blocks_for(len(prompt) + MAX_STEPS, BLOCK), BLOCK)
    table = kv.allocator.allocate(blocks_for(len(prompt) + MAX_STEPS, BLOCK))
    feed, past = list(prompt), 0
    out: list[int] = []
    fills: list[float] = []
    while len(out) < MAX_STEPS and not matcher.done():
        seq = SeqSpec("r", feed, past, table, sample=True)
        logits = chain_logits(model, build_batch([seq], BLOCK, model.device), kv)[0]  # [V]
        t0 = time.perf_counter()
        matcher.fill(bitmask)
        fills.append(time.perf_counter() - t0)
        token = int(logits.float().masked_fill(_banned(bitmask, vocab), -torch.inf).argmax())
        if not matcher.accept(token):
            raise AssertionError(f"{engine.name} refused its own token {token}")
        past += len(feed)
        out.append(token)
        feed = [token]
    kv.allocator.free(table)
    return tokenizer.decode(out, skip_special_tokens=True), fills


def _valid(text: str, schema: dict[str, Any]) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def compile_s(engine: Engine, schema: dict[str, Any], repeats: int) -> float:
    """Median seconds from a schema to a matcher ready for its first mask (an engine that
    compiles lazily, as llguidance, does its work when the matcher is made)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        engine.matcher(engine.compile(schema))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def engine_rows(model: Model, tokenizer: Any, repeats: int) -> list[dict[str, Any]]:
    rows = []
    for name, make in ENGINES.items():
        t0 = time.perf_counter()
        engine = make(tokenizer, model.config.vocab_size)
        setup_s = time.perf_counter() - t0
        fills: list[float] = []
        compiles: list[float] = []
        outputs: dict[str, dict[str, Any]] = {}
        for key, (what, schema) in SCHEMAS.items():
            compiles.append(compile_s(engine, schema, repeats))
            text, f = constrained_run(model, tokenizer, engine, engine.compile(schema),
                                      prompt_ids(tokenizer, what, schema))
            fills += f
            outputs[key] = {"text": text, "valid": _valid(text, schema), "steps": len(f),
                            "complete": len(f) < MAX_STEPS, "compile_s": compiles[-1]}
        fills.sort()
        rows.append({"engine": name, "version": engine.version, "setup_s": setup_s,
                     "fill_median_s": statistics.median(fills),
                     "fill_p90_s": fills[int(0.9 * (len(fills) - 1))], "fill_max_s": fills[-1],
                     "compile_median_s": statistics.median(compiles),
                     "compile_max_s": max(compiles), "steps": len(fills),
                     "valid": sum(o["valid"] for o in outputs.values()),
                     "complete": sum(o["complete"] for o in outputs.values()),
                     "outputs": outputs})
    return rows


def _us(s: float) -> str:
    return f"{s * 1e6:,.0f}"


def print_engines(rows: list[dict[str, Any]]) -> None:
    print_table(["engine", "version", "mask fill median (us)", "p90 (us)", "max (us)",
                 "compile median (ms)", "max (ms)", "tokenizer setup (s)",
                  "valid / complete / outputs"],
                "llrrrrrrr",
                [[r["engine"], r["version"], _us(r["fill_median_s"]), _us(r["fill_p90_s"]),
                  _us(r["fill_max_s"]), f"{r['compile_median_s'] * 1e3:.1f}",
                  f"{r['compile_max_s'] * 1e3:.1f}", f"{r['setup_s']:.2f}",
                  f"{r['valid']} / {r['complete']} / {len(SCHEMAS)}"] for r in rows])


def tpot(model: Model, tokenizer: Any, tokens: int, rounds: int) -> dict[str, Any]:
    """Seconds per output token of `models.generate` on the "product" prompt, greedy, with
    its JSON schema and without, interleaved `rounds` times, medians (prefill taken out by
    subtracting a 1-token run; the constrained run may end earlier, when its object does)."""
    grammars = Grammars(tokenizer, model.config.vocab_size)
    what, schema = SCHEMAS["product"]
    prompt = prompt_ids(tokenizer, what, schema)
    params = SamplingParams(temperature=0.0, max_tokens=tokens)
    one = SamplingParams(temperature=0.0, max_tokens=1)
    runs: dict[str, list[float]] = {"plain": [], "json_schema": []}
    steps: dict[str, int] = {}
    for _ in range(rounds):
        for name in runs:
            spec = GrammarSpec.json_schema(schema)
            c = grammars.constraint(spec) if name == "json_schema" else None
            t0 = time.perf_counter()
            generate(model, prompt, one)
            t1 = time.perf_counter()
            g = generate(model, prompt, params, constraint=c)
            t2 = time.perf_counter()
            steps[name] = len(g.token_ids)
            runs[name].append(((t2 - t1) - (t1 - t0)) / max(len(g.token_ids) - 1, 1))
    grammars.close()
    plain, constrained = statistics.median(runs["plain"]), statistics.median(runs["json_schema"])
    print_table(["request", "output tokens", "TPOT (ms)"], "lrr",
                [["no schema", steps["plain"], f"{plain * 1e3:.2f}"],
                 ["json_schema (product)", steps["json_schema"], f"{constrained * 1e3:.2f}"]])
    print(f"ratio: {constrained / plain:.3f}x (goal <= 1.15x)")
    return {"plain_tpot_s": plain, "json_schema_tpot_s": constrained,
            "ratio": constrained / plain, "steps": steps, "runs": runs}


TpotBench = Callable[[Model, Any, int, int], dict[str, Any]]


def run(spec: str, repeats: int, tpot_tokens: int, tpot_rounds: int,
        tpot: TpotBench | None = tpot) -> dict[str, Any]:
    from transformers import AutoTokenizer
    model = load(spec)
    tokenizer = AutoTokenizer.from_pretrained(str(model.path), local_files_only=True)
    print(machine_line())
    rows = engine_rows(model, tokenizer, repeats)
    print_engines(rows)
    result: dict[str, Any] = {**machine(), "model": spec, "engines": rows}
    if tpot is not None:
        result["tpot"] = tpot(model, tokenizer, tpot_tokens, tpot_rounds)
    return result


def main(argv: list[str] | None = None) -> None:
    p = parser("python -m benchmarks.models grammar", __doc__)
    p.add_argument("--model", default="default")
    p.add_argument("--repeats", type=int, default=5, help="compiles timed per schema")
    p.add_argument("--tpot-tokens", type=int, default=64)
    p.add_argument("--tpot-rounds", type=int, default=3)
    p.add_argument("--engines-only", action="store_true", help="skip the TPOT comparison")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    write_json(args.json, run(args.model, args.repeats, args.tpot_tokens, args.tpot_rounds,
                              None if args.engines_only else tpot))
