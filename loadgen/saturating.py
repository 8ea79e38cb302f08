"""The saturating recipe's figures: slicegate against vLLM under load, and issue 41's goals.

Interactive requests within the fixed TTFT SLO and their TTFT p50 / p90 / p99,
the interactive TPOT p50 under load beside its value alone (the alone run),
batch and total output tok/s, and each run's ratios to the vLLM peer's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from loadgen.benchtable import RunOutcome

PEER = "vllm"
# NOTE: issue 41's goals for the saturating mix, judged on the `slice` run.
MIN_ATTAINMENT = 0.99
MAX_TPOT_X_ALONE = 2.0
MIN_TOTAL_X_PEER = 1.2
MIN_BATCH_X_PEER = 1.25
_MARKS = {True: "met", False: "MISSED", None: "not checked (a run it needs is missing)"}


def _ratio(value: float | None, base: float | None) -> float | None:
    return None if value is None or not base else value / base


def run_figures(summary: Mapping[str, Any], alone: Mapping[str, Any] | None,
                peer: Mapping[str, Any] | None) -> dict[str, Any]:
    """One run's saturating figures; ratios are None where the run they need is missing."""
    tpot, tpot_alone = summary.get("hp_tpot_p50_s"), (alone or {}).get("hp_tpot_p50_s")
    return {
        "hp_requests": summary.get("hp_requests"),
        "hp_slo_attainment": summary.get("hp_slo_attainment"),
        "hp_ttft_p50_s": summary.get("hp_ttft_p50_s"),
        "hp_ttft_p90_s": summary.get("hp_ttft_p90_s"),
        "hp_ttft_p99_s": summary.get("hp_ttft_p99_s"),
        "hp_tpot_p50_s": tpot,
        "hp_tpot_alone_p50_s": tpot_alone,
        "tpot_x_alone": _ratio(tpot, tpot_alone),
        "lp_tok_s": summary.get("lp_tok_s"),
        "total_tok_s": summary.get("total_tok_s"),
        "batch_x_vllm": _ratio(summary.get("lp_tok_s"), (peer or {}).get("lp_tok_s")),
        "total_x_vllm": _ratio(summary.get("total_tok_s"), (peer or {}).get("total_tok_s")),
    }


def saturating_summary(outcomes: Mapping[str, RunOutcome], runs: Sequence[str],
                       alone_run: str | None) -> dict[str, Any]:
    """``{"runs": {name: figures}, "goals": {goal: met?}}`` for bench.json."""
    ran = {name: o.summary for name, o in outcomes.items() if o.ok}
    alone, peer = ran.get(alone_run or ""), ran.get(PEER)
    figures = {name: run_figures(ran[name], alone if name != PEER else None,
                                 peer if name != PEER else None)
               for name in runs if name in ran}
    return {"runs": figures, "goals": _goals(figures.get("slice"))}


def _at_least(value: float | None, bound: float) -> bool | None:
    return None if value is None else value >= bound


def _goals(sl: Mapping[str, Any] | None) -> dict[str, bool | None]:
    sl = sl or {}
    tpot_x = sl.get("tpot_x_alone")
    return {
        "interactive_slo_attainment": _at_least(sl.get("hp_slo_attainment"), MIN_ATTAINMENT),
        "tpot_under_load_x_alone": None if tpot_x is None else tpot_x <= MAX_TPOT_X_ALONE,
        "total_x_vllm": _at_least(sl.get("total_x_vllm"), MIN_TOTAL_X_PEER),
        "batch_x_vllm": _at_least(sl.get("batch_x_vllm"), MIN_BATCH_X_PEER),
    }


def _f(value: float | None, spec: str, scale: float = 1.0, suffix: str = "") -> str:
    return "–" if value is None else format(value * scale, spec) + suffix


def saturating_lines(summary: Mapping[str, Any], slo_s: float | None) -> list[str]:
    """The bench.md section: one row per run, then the goals for ``slice``."""
    lines = ["## Saturating mix", "",
             f"Interactive TTFT SLO {_f(slo_s, '.0f', 1000)} ms; TPOT alone: the alone run's "
             "interactive TPOT p50; ratios to vLLM's run.", "",
             "| run | interactive within SLO (requests) | TTFT p50 / p90 / p99 ms "
             "| TPOT p50 ms under load | alone | × alone | batch tok/s | batch × vLLM "
             "| total tok/s | total × vLLM |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in summary["runs"].items():
        ttft = " / ".join(_f(r[k], ".0f", 1000)
                          for k in ("hp_ttft_p50_s", "hp_ttft_p90_s", "hp_ttft_p99_s"))
        lines.append(
            f"| {name} | {_f(r['hp_slo_attainment'], '.1%')} ({r['hp_requests']}) | {ttft} "
            f"| {_f(r['hp_tpot_p50_s'], '.1f', 1000)} "
            f"| {_f(r['hp_tpot_alone_p50_s'], '.1f', 1000)} "
            f"| {_f(r['tpot_x_alone'], '.2f', suffix='×')} | {_f(r['lp_tok_s'], '.1f')} "
            f"| {_f(r['batch_x_vllm'], '.2f', suffix='×')} | {_f(r['total_tok_s'], '.1f')} "
            f"| {_f(r['total_x_vllm'], '.2f', suffix='×')} |")
    sl = summary["runs"].get("slice", {})
    goals = summary["goals"]
    texts = {
        "interactive_slo_attainment": f"interactive within the SLO "
        f"{_f(sl.get('hp_slo_attainment'), '.1%')} >= {MIN_ATTAINMENT:.0%}",
        "tpot_under_load_x_alone": f"interactive TPOT p50 under load "
        f"{_f(sl.get('tpot_x_alone'), '.2f', suffix='×')} alone <= {MAX_TPOT_X_ALONE:g}×",
        "total_x_vllm": f"total tok/s {_f(sl.get('total_x_vllm'), '.2f', suffix='×')} vLLM's "
        f">= {MIN_TOTAL_X_PEER:g}×",
        "batch_x_vllm": f"batch tok/s {_f(sl.get('batch_x_vllm'), '.2f', suffix='×')} vLLM's "
        f">= {MIN_BATCH_X_PEER:g}×",
    }
    return [*lines, "", *(f"- slice: {texts[k]}: {_MARKS[v]}" for k, v in goals.items()), ""]
