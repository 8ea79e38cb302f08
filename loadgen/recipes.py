"""The benches' recipes: interactive trace shapes, and what else a recipe sets.

A recipe names a window of a public trace reshaped for replay (``TraceSource``
options, see ``loadgen.workload``), and may set the bench's other defaults
(policies, batch tenant, SLO, alone run): ``RecipeDefaults``. A flag given on
the command line wins over a recipe's default.
"""

from __future__ import annotations

from dataclasses import dataclass

from loadgen.public_traces import AZURE_CODE, MOONCAKE_CONVERSATION, PublicTrace, require_trace

# NOTE: the recipes of `python -m benchmarks.scheduler policies`
# (benchmarks/scheduler/policies.py), so the two benches' tables can be read side by side:
# "default", the first 300 requests (bursty); "strict", a steadier window at a lower rate, whose
# SLO is tight.
TRACE_SHAPE = ("max_requests=300,rate_scale=0.8,prompt_scale=0.0625,max_prompt_tokens=1024,"
               "max_output_tokens=32")
SATURATING_BATCH = "concurrency=8,prompt=1024,gen=64"
RECIPES = {"default": TRACE_SHAPE,
           "strict": ("window_s=273.4-100000,max_requests=200,rate_scale=0.5,"
                      "prompt_scale=0.0625,max_prompt_tokens=1024,max_output_tokens=32"),
           # NOTE: the Mooncake conversation trace (hash_ids: shared prompt blocks), prompts
           # at 1/16 (its 512-token blocks become 32 tokens, two KV blocks of 16)
           "mooncake": ("window_s=600-100000,max_requests=90,rate_scale=0.5,"
                        "prompt_scale=0.0625,max_prompt_tokens=1024,max_output_tokens=32"),
           # NOTE: a minute of the Azure code trace (10:17.5-11:17.5 after its first request,
           # its silences shortest) at a quarter speed: 295 requests in 233 s, prompts x 1/16
           # up to 1024 tokens; beside SATURATING_BATCH (8 x 1024 + 64 always in flight).
           "saturating": ("window_s=617.5-677.5,rate_scale=0.25,prompt_scale=0.0625,"
                          "max_prompt_tokens=1024,max_output_tokens=32")}
RECIPE_TRACES: dict[str, PublicTrace] = {"mooncake": MOONCAKE_CONVERSATION}  # else Azure code


@dataclass(frozen=True, slots=True)
class RecipeDefaults:
    """What a recipe sets besides its trace; None leaves the bench's own default."""

    policies: tuple[str, ...] | None = None
    batch: str | None = None  # a tenant SOURCE
    slo_ms: float | None = None  # a fixed interactive TTFT SLO
    alone_policy: str | None = None
    always_alone: bool = False  # run the interactive tenant alone even with a fixed SLO
    ratios_to: str = "fcfs"  # the run the recipe's ratios are to


RECIPE_DEFAULTS = {
    # NOTE: issue 41's saturating mix: slice against vLLM (priority policy) under a fixed
    # 500 ms TTFT SLO; the alone run under slice gives the interactive TPOT alone.
    "saturating": RecipeDefaults(policies=("slice",), batch=SATURATING_BATCH, slo_ms=500.0,
                                 alone_policy="slice", always_alone=True, ratios_to="vllm"),
}


def recipe_defaults(recipe: str) -> RecipeDefaults:
    """The recipe's defaults (none for the recipes that only shape the trace)."""
    if recipe not in RECIPES:
        raise ValueError(f"unknown recipe {recipe!r} (known: {', '.join(RECIPES)})")
    return RECIPE_DEFAULTS.get(recipe, RecipeDefaults())


def shortened(shape: str, max_requests: int | None = None, span_s: float | None = None) -> str:
    """A trace shape cut for a short run: its first ``max_requests`` requests (replacing its
    own cap) and the first ``span_s`` seconds of replay (its window's end moved in by
    ``span_s`` x its rate_scale); None leaves that side as it is."""
    items = dict(item.split("=", 1) for item in shape.split(",") if item)
    if max_requests is not None:
        if max_requests < 1:
            raise ValueError(f"max_requests must be >= 1, got {max_requests}")
        items["max_requests"] = str(max_requests)
    if span_s is not None:
        if span_s <= 0:
            raise ValueError(f"span_s must be > 0, got {span_s}")
        start, _, end = items.get("window_s", "0-inf").partition("-")
        new_end = min(float(end), float(start) + span_s * float(items.get("rate_scale", 1)))
        items["window_s"] = f"{start}-{new_end:g}"
    return ",".join(f"{k}={v}" for k, v in items.items())


def default_interactive(recipe: str = "default", max_requests: int | None = None,
                        span_s: float | None = None) -> str:
    """The public trace shaped by a recipe (cut by ``shortened`` when asked); MissingTrace
    (with what to do) without a copy."""
    trace = require_trace(RECIPE_TRACES.get(recipe, AZURE_CODE), "python -m loadgen bench",
                          instead=f"give the interactive tenant yourself, e.g. --interactive "
                                  f"synthetic-coding,{TRACE_SHAPE} (the shipped synthetic trace)")
    return f"{trace},{shortened(RECIPES[recipe], max_requests, span_s)}"
