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
           # NOTE: two minutes of the Azure code trace (20:50-22:50 after its first request)
           # at half speed: 279 requests in 240 s, prompts x 1/16 up to 1024 tokens; beside
           # SATURATING_BATCH (8 x 1024 + 64 always in flight) it keeps both CPU cores busy.
           "saturating": ("window_s=1250-1370,rate_scale=0.5,prompt_scale=0.0625,"
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


def with_max_requests(shape: str, max_requests: int | None) -> str:
    """A trace shape whose ``max_requests`` is ``max_requests`` (None: the shape as it is)."""
    if max_requests is None:
        return shape
    if max_requests < 1:
        raise ValueError(f"max_requests must be >= 1, got {max_requests}")
    kept = [item for item in shape.split(",") if not item.startswith("max_requests=")]
    return ",".join([*kept, f"max_requests={max_requests}"])


def default_interactive(recipe: str = "default", max_requests: int | None = None) -> str:
    """The public trace shaped by a recipe (its first ``max_requests`` requests when given);
    MissingTrace (with what to do) without a copy."""
    trace = require_trace(RECIPE_TRACES.get(recipe, AZURE_CODE), "python -m loadgen bench",
                          instead=f"give the interactive tenant yourself, e.g. --interactive "
                                  f"synthetic-coding,{TRACE_SHAPE} (the shipped synthetic trace)")
    return f"{trace},{with_max_requests(RECIPES[recipe], max_requests)}"
