"""`python -m loadgen ceiling`: the most of a workload's requests that any server could start
within a TTFT SLO on this machine.

A request has no first token before its prompt is prefilled. The floor of that time here: the
model's own operator chain (`python -m models direct`, in a subprocess) on one thread, alone on
an idle machine, the fastest of its repeats (and of the dtypes asked for), divided by the
machine's cores, as if every core worked on that one prompt with no loss and nothing else ran.
A request whose floor exceeds the SLO misses it whatever a server does; the ceiling is the share
of the others. Queueing, decode steps, tokenizing and HTTP only add to a real server's times,
so the ceiling is an upper bound on its SLO attainment, not a forecast.

Prefill time grows with the prompt, so a size's floor is that of the largest measured size at
or below it. Which sizes are measured: a ladder over the workload's distinct prompt sizes, then
every distinct size between the ladder's last that fits and its first that does not: the
sizes above the SLO's edge are then each bounded by a measured size that misses it.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadgen.direct import run_models_direct
from loadgen.traces import TraceRequest

LADDER_STEPS = 8
Floors = dict[int, float]  # prompt tokens -> fastest one-thread first token, seconds
Measure = Callable[[Sequence[int], int], Floors]  # (sizes, threads) -> measured floors


@dataclass(frozen=True, slots=True)
class Ceiling:
    """What a workload's floors allow under `slo_s` on `cores` cores."""

    requests: int
    slo_s: float
    cores: int
    over: tuple[tuple[float, int, float], ...]  # (arrival s, prompt tokens, floor s) missing it

    @property
    def attainable(self) -> float:
        return 1.0 - len(self.over) / self.requests if self.requests else 1.0


def floor_s(floors: Mapping[int, float], num_tokens: int, cores: int) -> float:
    """The floor of a prompt's first token with `cores` cores: the one-thread floor of the
    largest measured size at or below it, over the cores (0 below every measured size)."""
    sizes = sorted(floors)
    i = bisect.bisect_right(sizes, num_tokens)
    return floors[sizes[i - 1]] / cores if i else 0.0


def ladder(sizes: Sequence[int], steps: int = LADDER_STEPS) -> list[int]:
    """About `steps` of the distinct sizes, evenly spaced in rank, the smallest and largest
    included."""
    distinct = sorted(set(sizes))
    if len(distinct) <= steps:
        return distinct
    picks = {round(k * (len(distinct) - 1) / (steps - 1)) for k in range(steps)}
    return [distinct[i] for i in sorted(picks)]


def bracket(sizes: Sequence[int], floors: Mapping[int, float], cores: int,
            slo_s: float) -> list[int]:
    """The distinct sizes not yet measured between the largest measured size that fits the
    SLO and the smallest that does not (all of them above, where none fits)."""
    fit = [n for n, s in floors.items() if s / cores <= slo_s]
    miss = [n for n, s in floors.items() if s / cores > slo_s]
    lo = max(fit, default=0)
    hi = min(miss, default=None)
    if hi is None:
        return []
    return sorted({n for n in sizes if lo < n < hi and n not in floors})


def ceiling(arrivals: Sequence[TraceRequest], floors: Mapping[int, float], cores: int,
            slo_s: float) -> Ceiling:
    """The requests whose floor exceeds the SLO (see the module docstring)."""
    over = []
    for r in arrivals:
        f = floor_s(floors, r.prompt_tokens, cores)
        if f > slo_s:
            over.append((r.arrival_s, r.prompt_tokens, f))
    return Ceiling(len(arrivals), slo_s, cores, tuple(over))


def measure_floors(arrivals: Sequence[TraceRequest], measure: Measure, cores: int,
                   slo_s: float) -> Floors:
    """The ladder's floors, then the bracket's (one thread)."""
    sizes = [r.prompt_tokens for r in arrivals]
    floors = measure(ladder(sizes), 1)
    edge = bracket(sizes, floors, cores, slo_s)
    return {**floors, **measure(edge, 1)} if edge else floors


@dataclass(frozen=True, slots=True)
class DirectRunner:
    """`python -m models direct` over prompts of given sizes: the fastest first token of each
    measured size over repeats and dtypes."""

    model: str
    dtypes: tuple[str, ...]
    repeats: int
    prompt: Callable[[int, int | str], str]  # (tokens, salt) -> text
    workdir: Path
    python: str = sys.executable

    def __call__(self, sizes: Sequence[int], threads: int) -> Floors:
        out: Floors = {}
        if not sizes:
            return out
        cases = [{"prompt": self.prompt(n, f"ceiling-{n}"), "max_tokens": 1} for n in sizes]
        for dtype in self.dtypes:
            for case in run_models_direct(self.python, self.model, dtype, threads,
                                          self.repeats, cases,
                                          self.workdir / f"ceiling-cases-{threads}.json"):
                n, fastest = int(case["prompt_tokens"]), min(case["ttft_s"])
                out[n] = min(out.get(n, fastest), fastest)
        return out


def summary(result: Ceiling, floors: Floors, all_cores: Floors, source: str) -> dict[str, Any]:
    """The JSON document of one run."""
    return {"source": source, "requests": result.requests, "slo_ms": 1e3 * result.slo_s,
            "cores": result.cores, "attainable": result.attainable,
            "over": [{"arrival_s": a, "prompt_tokens": n, "floor_ms": 1e3 * f}
                     for a, n, f in result.over],
            "one_thread_floor_ms": {str(n): 1e3 * s for n, s in sorted(floors.items())},
            "all_cores_measured_ms": {str(n): 1e3 * s for n, s in sorted(all_cores.items())}}


def markdown(doc: Mapping[str, Any]) -> str:
    over = doc["over"]
    sizes = sorted({o["prompt_tokens"] for o in over})
    lines = [f"{doc['requests']} requests, TTFT SLO {doc['slo_ms']:.0f} ms, {doc['cores']} cores: "
             f"at most **{100 * doc['attainable']:.1f}%** can start within it on this machine",
             f"- {len(over)} cannot, even alone on an idle machine with every core on its "
             f"prefill and no loss: prompts of {', '.join(map(str, sizes)) or '-'} tokens",
             "- one-thread floor (fastest of repeats), ms: " + ", ".join(
                 f"{n}: {ms:.0f}" for n, ms in doc["one_thread_floor_ms"].items())]
    for n, ms in doc["all_cores_measured_ms"].items():
        lines.append(f"- measured on {doc['cores']} threads, {n} tokens: {ms:.0f} ms (the floor "
                     f"takes {doc['one_thread_floor_ms'].get(n, float('nan')) / doc['cores']:.0f})")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from loadgen.prompts import PromptBuilder, resolve_model_folder
    from loadgen.recipes import default_interactive
    from loadgen.workload import parse_source, plan_arrivals

    source = args.interactive or default_interactive(args.recipe)
    arrivals = plan_arrivals(parse_source(source))
    folder = resolve_model_folder(args.model)
    args.out.mkdir(parents=True, exist_ok=True)
    runner = DirectRunner(str(folder), tuple(args.dtypes.split(",")), args.repeats,
                          PromptBuilder.from_folder(folder).text, args.out)
    cores, slo_s = args.cores or len(os.sched_getaffinity(0)), args.slo_ms / 1000
    floors = measure_floors(arrivals, runner, cores, slo_s)
    doc = summary(ceiling(arrivals, floors, cores, slo_s), floors,
                  runner([max(floors)], cores), source)
    (args.out / "ceiling.json").write_text(json.dumps(doc, indent=1))
    print(markdown(doc))
    return 0


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--recipe", default="saturating", help="the trace recipe (default: saturating)")
    p.add_argument("--interactive", default=None, help="a tenant SOURCE instead of the recipe's")
    p.add_argument("--slo-ms", type=float, default=500.0)
    p.add_argument("--model", default="default")
    p.add_argument("--dtypes", default="bfloat16,float32",
                   help="each measured; the fastest counts (default: bfloat16,float32)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cores", type=int, default=None, help="default: the CPUs this process may use")
    p.add_argument("--out", type=Path, default=Path("bench-results/ceiling"))
    p.set_defaults(fn=run)
