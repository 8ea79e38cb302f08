"""The two-model bench's table: one row per layout, ratios to the static split and to vLLM,
and issue 43's goals for ``slice``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from loadgen.benchtable import RunOutcome

# NOTE: issue 43 item 4's goals, judged on the `slice` layout.
MIN_ATTAINMENT = 0.99
MIN_BATCH_X_STATIC = 1.25
_MARKS = {True: "met", False: "MISSED", None: "not checked (a layout it needs is missing)"}
_FIGURES = ("hp_requests", "hp_slo_attainment", "hp_ttft_p50_s", "hp_ttft_p90_s",
            "hp_ttft_p99_s", "hp_tpot_p50_s", "lp_tok_s", "total_tok_s", "errors")


def _ratio(value: float | None, base: float | None) -> float | None:
    return None if value is None or not base else value / base


def models_summary(outcomes: Mapping[str, RunOutcome]) -> dict[str, Any]:
    """``{"runs": {layout: figures and batch ratios}, "goals": {goal: met?}}``."""
    ran = {name: o.summary for name, o in outcomes.items() if o.ok}
    static, vllm = ran.get("static", {}), ran.get("vllm", {})
    runs = {name: {**{k: s.get(k) for k in _FIGURES},
                   "batch_x_static": _ratio(s["lp_tok_s"], static.get("lp_tok_s")),
                   "batch_x_vllm": _ratio(s["lp_tok_s"], vllm.get("lp_tok_s"))}
            for name, s in ran.items()}
    return {"runs": runs, "goals": _goals(runs)}


def _goals(runs: Mapping[str, Mapping[str, Any]]) -> dict[str, bool | None]:
    sl, vllm = runs.get("slice"), runs.get("vllm")
    attained = sl["hp_slo_attainment"] if sl else None
    vllm_attained = vllm["hp_slo_attainment"] if vllm else None
    x_static = sl["batch_x_static"] if sl else None
    x_vllm = sl["batch_x_vllm"] if sl else None
    return {
        "interactive_slo_attainment": None if attained is None else attained >= MIN_ATTAINMENT,
        "batch_x_static": None if x_static is None else x_static >= MIN_BATCH_X_STATIC,
        "attainment_above_vllm": None if attained is None or vllm_attained is None
        else attained > vllm_attained,
        "batch_above_vllm": None if x_vllm is None else x_vllm > 1.0,
    }


def _f(value: float | None, spec: str, scale: float = 1.0, suffix: str = "") -> str:
    return "–" if value is None else format(value * scale, spec) + suffix


def layouts_table(outcomes: Mapping[str, RunOutcome], summary: Mapping[str, Any],
                  layouts: Sequence[str]) -> list[str]:
    """One markdown row per layout (or why it did not run)."""
    lines = ["| layout | interactive within SLO (requests) | TTFT p50 / p90 / p99 ms "
             "| TPOT p50 ms | batch model tok/s | × static | × vLLM | errors | note |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for name in layouts:
        outcome = outcomes.get(name)
        if outcome is None or not outcome.ok:
            reason = "the bench was interrupted" if outcome is None else " ".join(
                (outcome.reason or "").split())[:240]
            lines.append(f"| {name} | did not run: {reason} |||||||| ")
            continue
        r = summary["runs"][name]
        ttft = " / ".join(_f(r[k], ".0f", 1000)
                          for k in ("hp_ttft_p50_s", "hp_ttft_p90_s", "hp_ttft_p99_s"))
        lines.append(
            f"| {name} | {_f(r['hp_slo_attainment'], '.1%')} ({r['hp_requests']}) | {ttft} "
            f"| {_f(r['hp_tpot_p50_s'], '.1f', 1000)} | {_f(r['lp_tok_s'], '.1f')} "
            f"| {_f(r['batch_x_static'], '.2f', suffix='×')} "
            f"| {_f(r['batch_x_vllm'], '.2f', suffix='×')} | {r['errors']} | {outcome.note} |")
    return lines


def goal_lines(summary: Mapping[str, Any]) -> list[str]:
    """The goals for ``slice``, each with the figure it was judged on."""
    runs, goals = summary["runs"], summary["goals"]
    sl, vllm = runs.get("slice", {}), runs.get("vllm", {})
    texts = {
        "interactive_slo_attainment": f"interactive within its TTFT SLO "
        f"{_f(sl.get('hp_slo_attainment'), '.1%')} >= {MIN_ATTAINMENT:.0%}",
        "batch_x_static": f"batch model tok/s {_f(sl.get('batch_x_static'), '.2f', suffix='×')} "
        f"the static split's >= {MIN_BATCH_X_STATIC:g}×",
        "attainment_above_vllm": f"interactive within SLO above two vLLM servers' "
        f"({_f(vllm.get('hp_slo_attainment'), '.1%')})",
        "batch_above_vllm": f"batch model tok/s above two vLLM servers' "
        f"({_f(sl.get('batch_x_vllm'), '.2f', suffix='×')})",
    }
    return [f"- slice: {texts[k]}: {_MARKS[v]}" for k, v in goals.items()]


def format_models_markdown(doc: Mapping[str, Any], outcomes: Mapping[str, RunOutcome],
                           layouts: Sequence[str]) -> str:
    """bench.md: the setup, the layouts side by side, the goals, each layout's servers."""
    config = doc["config"]
    lines = [
        "# slicegate two-model bench", "",
        f"{doc['started_at']} to {doc['finished_at']}"
        + (" (interrupted)" if doc["interrupted"] else "") + f": `{doc['command']}`", "",
        f"Two instances of {config['model']} ({doc['model_folder']}), {config['dtype']}, "
        f"max model len {config['max_model_len']}: chat (interactive: {config['interactive']}, "
        f"{doc['interactive_requests']} requests, TTFT SLO {_f(doc['slo_s'], '.0f', 1000)} ms) "
        f"and batch ({config['batch']}, sending for {doc['batch_duration_s']:.1f} s).", "",
        *layouts_table(outcomes, doc["summary"], layouts), "",
        "## Goals", "", *goal_lines(doc["summary"]), "", "## Servers", ""]
    for name, outcome in outcomes.items():
        for command in outcome.summary.get("servers", []):
            lines.append(f"- {name}: `{command}`")
        if outcome.report_path:
            lines.append(f"- {name}: {outcome.report_path.parent.parent}")
    return "\n".join(lines) + "\n"
