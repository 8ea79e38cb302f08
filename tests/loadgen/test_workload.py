"""loadgen.workload: tenant spec parsing, its errors, and planned arrivals."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadgen.workload import (
    ClosedLoop,
    OpenLoop,
    TraceSource,
    WorkloadError,
    describe,
    parse_source,
    parse_tenant,
    parse_tenants,
    plan_arrivals,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def test_trace_tenant_with_options() -> None:
    tenant = parse_tenant("ide:sk-1:synthetic-coding,rate_scale=2,token_scale=0.5,"
                          "window_s=10-70,max_total_tokens=2048,max_requests=50:priority=0")
    assert tenant.name == "ide" and tenant.api_key == "sk-1" and tenant.priority == 0
    assert tenant.slo_s is None and not tenant.is_closed_loop
    assert tenant.source == TraceSource("synthetic-coding", (
        ("rate_scale", 2.0), ("token_scale", 0.5), ("window_s", (10.0, 70.0)),
        ("max_total_tokens", 2048), ("max_requests", 50)))


def test_open_and_closed_loop_sources() -> None:
    assert parse_source("rate=1.5,prompt=512,gen=16") == OpenLoop(1.5, 512, 16)
    assert parse_source("rate=2,prompt=8,gen=2,requests=10,arrival=uniform,seed=3") == OpenLoop(
        2.0, 8, 2, 10, "uniform", 3)
    assert parse_source("concurrency=8,prompt=512,gen=16") == ClosedLoop(8, 512, 16)
    assert parse_source("concurrency=2,prompt=4,gen=4,requests=6") == ClosedLoop(2, 4, 4, 6)


def test_tenant_options_empty_key_and_colons_in_a_path() -> None:
    tenant = parse_tenant("batch::/data/a:b.csv,max_requests=3:slo_ms=250:priority=2")
    assert tenant.api_key == ""
    assert tenant.source == TraceSource("/data/a:b.csv", (("max_requests", 3),))
    assert tenant.priority == 2 and tenant.slo_s == 0.25


@pytest.mark.parametrize(("spec", "message"), [
    ("ide", "expected NAME:KEY:SOURCE"),
    ("ide:k", "expected NAME:KEY:SOURCE"),
    ("i de:k:synthetic-coding", "the name must be"),
    ("ide:k::priority=1", "the SOURCE is empty"),
    ("ide:k:synthetic-coding:priority=x", "priority must be an integer, got 'x'"),
    ("ide:k:synthetic-coding:priority=1:priority=2", "priority is given twice"),
    ("ide:k:synthetic-coding:slo_ms=0", "slo_ms must be a number > 0"),
    ("ide:k:synthetic-coding,speed=2", "unknown option 'speed'"),
    ("ide:k:synthetic-coding,rate_scale", "expected key=value, got 'rate_scale'"),
    ("ide:k:synthetic-coding,rate_scale=fast", "rate_scale must be a number > 0, got 'fast'"),
    ("ide:k:synthetic-coding,rate_scale=-1", "rate_scale must be a number > 0"),
    ("ide:k:synthetic-coding,max_requests=0", "max_requests must be >= 1, got 0"),
    ("ide:k:synthetic-coding,window_s=70-10", "window_s must be START-END"),
    ("ide:k:synthetic-coding,window_s=10", "window_s must be START-END"),
    ("ide:k:rate=1,concurrency=2,prompt=1,gen=1", "exactly one of rate=R"),
    ("ide:k:prompt=1,gen=1", "exactly one of rate=R"),
    ("ide:k:rate=1,gen=1", "missing prompt=N"),
    ("ide:k:concurrency=4,prompt=1", "missing gen=N"),
    ("ide:k:concurrency=0,prompt=1,gen=1", "concurrency must be >= 1"),
    ("ide:k:rate=1,prompt=1,gen=1,arrival=bursty", "arrival must be poisson or uniform"),
    ("ide:k:concurrency=1,prompt=1,gen=1,seed=2", "seed= does not apply to a closed-loop"),
    ("ide:k:rate=1,prompt=1,gen=1,prompt=2", "prompt is given twice"),
])
def test_spec_errors_say_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(WorkloadError, match="tenant") as info:
        parse_tenant(spec)
    assert message in str(info.value)


def test_tenant_names_must_be_unique() -> None:
    with pytest.raises(WorkloadError, match="'a' is used twice"):
        parse_tenants(["a::rate=1,prompt=1,gen=1", "a::concurrency=1,prompt=1,gen=1"])
    with pytest.raises(WorkloadError, match="no tenants"):
        parse_tenants([])


def test_open_loop_arrivals() -> None:
    uniform = plan_arrivals(OpenLoop(4.0, 10, 2, arrival="uniform"), duration_s=1.0)
    assert [r.arrival_s for r in uniform] == [0.0, 0.25, 0.5, 0.75]
    assert all((r.prompt_tokens, r.output_tokens) == (10, 2) for r in uniform)
    poisson = OpenLoop(50.0, 1, 1, num_requests=200, seed=7)
    first, again = plan_arrivals(poisson), plan_arrivals(poisson)
    assert first == again and len(first) == 200
    assert 2.0 < first[-1].arrival_s < 6.0  # ~200 / 50 s
    with pytest.raises(WorkloadError, match="needs requests=N or a replay duration"):
        plan_arrivals(OpenLoop(1.0, 1, 1))
    with pytest.raises(TypeError):
        plan_arrivals(ClosedLoop(1, 1, 1))


def test_trace_arrivals_and_trace_errors() -> None:
    source = parse_source("synthetic-coding,max_requests=20,rate_scale=2,max_total_tokens=512")
    planned = plan_arrivals(source)
    assert len(planned) == 20 and planned[0].arrival_s == 0.0
    assert all(r.prompt_tokens + r.output_tokens <= 512 for r in planned)
    assert len(plan_arrivals(source, duration_s=planned[5].arrival_s)) <= 5
    azure = plan_arrivals(parse_source(str(FIXTURES / "azure_small.csv")))
    assert [r.prompt_tokens for r in azure] == [4808, 3180, 110, 1]
    with pytest.raises(WorkloadError, match="missing.csv"):
        plan_arrivals(parse_source("/nonexistent/missing.csv"))


def test_one_sided_scales_come_before_the_caps() -> None:
    base = plan_arrivals(parse_source(f"{FIXTURES / 'azure_small.csv'}"))
    scaled = plan_arrivals(parse_source(
        f"{FIXTURES / 'azure_small.csv'},prompt_scale=0.5,output_scale=2,max_prompt_tokens=2000,"
        "max_output_tokens=40"))
    assert [r.arrival_s for r in scaled] == [r.arrival_s for r in base]
    assert [r.prompt_tokens for r in scaled] == [2000, 1590, 55, 1]
    assert [r.output_tokens for r in scaled] == [20, 16, 40, 28]


def test_describe() -> None:
    assert describe(parse_source("synthetic-coding,window_s=0-60")) == (
        "trace synthetic-coding (window_s=0-60)")
    assert describe(parse_source("rate=2,prompt=5,gen=3")) == (
        "open loop 2 req/s (poisson), prompt 5, gen 3")
    assert describe(parse_source("concurrency=4,prompt=5,gen=3,requests=9")) == (
        "closed loop x4, prompt 5, gen 3, 9 requests")
