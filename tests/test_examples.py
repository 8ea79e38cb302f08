"""examples/: the Grafana dashboard queries only metrics a real server exports, and the
Prometheus config scrapes the path that serves them.

Metric names are read from each PromQL expression by a small tokenizer: string literals,
dashboard variables, label matchers, range selectors and `by (...)`-style label lists are
cut out, and what is left that looks like a name and is not a function call or a keyword is
a metric. The names are checked against what `/metrics` of a running gateway declares.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.serve import GatewayProcess

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
DASHBOARD = EXAMPLES / "grafana" / "slicegate.json"
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
            "and", "or", "unless", "inf", "nan"}
_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'')
_VARIABLE = re.compile(r"\$\{\w+(?::\w+)?\}|\$\w+")
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_NAME = re.compile(r"(?<![\w.:])[A-Za-z_:][A-Za-z0-9_:]*")
_SELECTOR = re.compile(r"(?<![\w.:])([A-Za-z_:][A-Za-z0-9_:]*)\s*\{([^{}]*)\}")
_MATCHER_LABEL = re.compile(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*([A-Za-z_:][\w:]*)\s*,\s*\w+\s*\)\s*$")
TENANTS = """admin_keys: [sk-admin-1]
tenants:
  - name: ide
    api_keys: [sk-ide-1]
    priority: high
    ttft_slo_ms: 2000
  - name: nightly
    api_keys: [sk-nightly-1]
    priority: low
    budget: {daily_tokens: 1000000, monthly_tokens: 20000000}
"""


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads."""
    label_values = _LABEL_VALUES.match(expr)  # Grafana's label_values(metric, label)
    if label_values:
        return {label_values.group(1)}
    text = _STRING.sub('""', expr)
    text = _VARIABLE.sub("1", text)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _LABEL_LIST.sub(" ", text)
    names = set()
    for match in _NAME.finditer(text):
        calls = text[match.end():].lstrip().startswith("(")
        if not calls and match.group() not in KEYWORDS:
            names.add(match.group())
    return names


def grouping_labels(expr: str) -> set[str]:
    """The labels of `by (...)` / `without (...)` / `on (...)` / `ignoring (...)` lists."""
    text = _VARIABLE.sub("1", _STRING.sub('""', expr))
    return {label.strip() for group in _LABEL_LIST.findall(text)
            for label in group[group.index("(") + 1:-1].split(",") if label.strip()}


def selector_labels(expr: str) -> set[tuple[str, str]]:
    """(metric, label) for every label matcher on a named metric."""
    text = _VARIABLE.sub("1", _STRING.sub('""', expr))
    return {(name, label) for name, matchers in _SELECTOR.findall(text)
            for label in _MATCHER_LABEL.findall(matchers)}


def expressions(node: Any) -> Iterator[str]:
    """Every PromQL `expr` of panels (rows included) and every templating query."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield value
            elif key == "query" and isinstance(value, dict) and "query" in value:
                yield value["query"]
            else:
                yield from expressions(value)
    elif isinstance(node, list):
        for item in node:
            yield from expressions(item)


def exported(metrics_text: str) -> dict[str, set[str]]:
    """Series name -> its label names, for every series /metrics declares (families with
    no sample yet included, by their type's series names)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
                "summary": ("_sum", "_count")}
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(metrics_text):
        for suffix in suffixes.get(family.type, ("",)):
            out.setdefault(family.name + suffix, set())
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    return out


def problems(dashboard: Any, series: dict[str, set[str]]) -> list[str]:
    """What the dashboard queries that the server does not export."""
    out = []
    for expr in expressions(dashboard):
        out += [f"{name}: not exported ({expr})" for name in sorted(metric_names(expr))
                if name not in series]
        out += [f"{name}{{{label}}}: no such label ({expr})"
                for name, label in sorted(selector_labels(expr))
                if name in series and series[name] and label not in series[name]]
        # NOTE: a grouping label is checked where every metric of the expression has
        # samples (a family with none yet, as preemptions on an idle server, has no labels)
        known = [series.get(name) for name in metric_names(expr)]
        if known and all(known):
            labels = set().union(*known)  # type: ignore[arg-type]
            out += [f"by ({label}): no metric has it ({expr})"
                    for label in sorted(grouping_labels(expr) - labels)]
    return out


def test_the_tokenizer_finds_metrics_and_skips_the_rest() -> None:
    expr = ('histogram_quantile(0.95, sum by (tenant, le) (rate(vllm:ttft_bucket{tenant=~'
            '"$tenant", le!="1e3"}[$__rate_interval]))) / on(tenant) group_left '
            'max without (x) (slo_seconds offset 5m) > bool 1e3 and vector($tpot) unless '
            'other_metric[5m:1m]')
    assert metric_names(expr) == {"vllm:ttft_bucket", "slo_seconds", "other_metric"}
    assert selector_labels(expr) == {("vllm:ttft_bucket", "tenant"), ("vllm:ttft_bucket", "le")}
    assert grouping_labels(expr) == {"tenant", "le", "x"}
    assert metric_names("label_values(vllm:request_success_total, tenant)") == {
        "vllm:request_success_total"}


def test_a_panel_naming_a_missing_metric_or_label_is_reported() -> None:
    series = {"up": {"job"}, "vllm:x_bucket": {"tenant", "le"}}
    dashboard = {"panels": [{"targets": [{"expr": "sum(rate(vllm:x_bucket{tenant=\"a\"}[5m]))"},
                                         {"expr": "rate(nope_total[5m]) + up{pod=\"p\"}"},
                                         {"expr": "sum by (job, pod) (up)"}]}]}
    assert problems(dashboard, series) == [
        "nope_total: not exported (rate(nope_total[5m]) + up{pod=\"p\"})",
        "up{pod}: no such label (rate(nope_total[5m]) + up{pod=\"p\"})",
        "by (pod): no metric has it (sum by (job, pod) (up))"]


@pytest.fixture(scope="module")
def metrics_text(tmp_path_factory: pytest.TempPathFactory) -> str:
    """/metrics of a real gateway (tiny model, two tenants) after a plain and a streamed
    request, so that the histograms and per-tenant series have samples."""
    tmp = tmp_path_factory.mktemp("dashboard")
    (tmp / "tenants.yaml").write_text(TENANTS)
    args = ["--model", "tiny-random", "--dtype", "float32", "--device-memory-gib", "0.25",
            "--tenants", str(tmp / "tenants.yaml"), "--log-level", "warning",
            "--data-dir", str(tmp / "data")]
    with GatewayProcess(args, tmp / "server.log") as server:
        for key in ("sk-ide-1", "sk-nightly-1"):
            with openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0) as c:
                c.completions.create(model="tiny-random", prompt="hello " * 20, max_tokens=4)
                list(c.chat.completions.create(
                    model="tiny-random", messages=[{"role": "user", "content": "hi"}],
                    max_tokens=4, stream=True))
        return httpx.get(f"{server.url}/metrics", timeout=10).text


def test_every_dashboard_query_names_exported_metrics(metrics_text: str) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = list(expressions(dashboard))
    assert len(queries) >= 20
    series = exported(metrics_text)
    assert problems(dashboard, series) == []
    used = set().union(*(metric_names(q) for q in queries))
    for wanted in ("vllm:time_to_first_token_seconds_bucket", "slicegate_tenant_ttft_slo_seconds",
                   "vllm:time_per_output_token_seconds_bucket", "slicegate_slo_attainment",
                   "vllm:num_requests_waiting", "slicegate_device_busy_ratio",
                   "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total",
                   "slicegate_shed_total"):
        assert wanted in used, wanted  # what the issue asks the dashboard to show


def test_the_dashboard_imports_with_a_datasource_variable() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert dashboard["__inputs"][0]["name"] == "DS_PROMETHEUS"
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert {p["datasource"]["uid"] for p in panels} == {"${datasource}"}
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    for panel in panels:
        assert panel["targets"] and panel["description"], panel["title"]


def test_the_prometheus_config_scrapes_metrics() -> None:
    config = yaml.safe_load((EXAMPLES / "prometheus.yml").read_text())
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "slicegate")
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"][0]["targets"] == ["127.0.0.1:8000"]
