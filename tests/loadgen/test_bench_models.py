"""loadgen bench-models: each layout's servers and tenants file, the table, and a run on stubs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from gateway.tenants import parse_tenants as parse_tenants_yaml
from loadgen import bench_models
from loadgen.__main__ import main
from loadgen.bench_models import (
    ModelsBenchConfig,
    build_layout,
    core_of,
    run_models_bench,
    static_layout,
    vllm_layout,
)
from loadgen.benchtable import RunOutcome
from loadgen.modelstable import goal_lines, models_summary

TINY: dict[str, Any] = {
    "interactive": "synthetic-coding,max_requests=10,rate_scale=20,token_scale=0.05,"
                   "max_total_tokens=256",
    "batch": "concurrency=2,prompt=16,gen=8", "warmup_requests": 1}


def _config(tmp_path: Path, **kwargs: Any) -> ModelsBenchConfig:
    return ModelsBenchConfig(out=tmp_path / "out",
                             serve_cmd=("python", "-m", "gateway", "serve"), **kwargs)


def test_the_slice_layout_is_one_server_with_both_models(tmp_path: Path) -> None:
    layout = build_layout(_config(tmp_path), "slice", Path("/m"), tmp_path / "run")
    (server,) = layout.servers
    command = " ".join(server.command)
    assert command.startswith("python -m gateway serve --model chat=default --policy slice ")
    assert "--devices cpu:0,cpu:1" in command and "--model batch=default" in command
    assert f"--data-dir {tmp_path / 'run' / 'data-slice'}" in command
    assert layout.targets == {"interactive": (0, "chat"), "batch": (0, "batch")}
    tenants = parse_tenants_yaml((tmp_path / "run" / "tenants.yaml").read_text())
    chat, batch = tenants.tenant_named("interactive"), tenants.tenant_named("batch")
    assert chat is not None and batch is not None
    assert (chat.default_model, chat.ttft_slo_s, chat.priority.name) == ("chat", 0.5, "HIGH")
    assert (batch.default_model, batch.ttft_slo_s, batch.priority.name) == ("batch", None, "LOW")


def test_the_static_split_is_one_server_per_core(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_models.shutil, "which", lambda name: "/usr/bin/" + name)
    layout = static_layout(_config(tmp_path), (8001, 8002), tmp_path / "t.yaml")
    chat, batch = layout.servers
    assert chat.command[:3] == ("taskset", "-c", "0") and batch.command[:3] == ("taskset", "-c",
                                                                                "1")
    for spec, device in ((chat, "cpu:0"), (batch, "cpu:1")):
        command = " ".join(spec.command)
        assert f"--devices {device}" in command and "--cpu-threads 1" in command
        assert f"--data-dir {tmp_path}/data-{spec.name}" in command  # one lock each
        assert "--model default " in command
    assert (chat.name, batch.name, chat.port, batch.port) == ("static-chat", "static-batch",
                                                              8001, 8002)
    assert layout.targets == {"interactive": (0, None), "batch": (1, None)}
    assert layout.note == ""
    monkeypatch.setattr(bench_models.shutil, "which", lambda name: None)
    bare = static_layout(_config(tmp_path), (8001, 8002), tmp_path / "t.yaml")
    assert bare.servers[0].command[0] == "python" and bare.note == "not pinned to cores"
    unpinned = static_layout(_config(tmp_path, pin=False), (8001, 8002), tmp_path / "t.yaml")
    assert unpinned.servers[1].command[0] == "python"


def test_two_vllm_servers_each_bind_one_core(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_models.shutil, "which", lambda name: "/usr/bin/" + name)
    layout = vllm_layout(_config(tmp_path), Path("/m"), (9001, 9002))
    chat, batch = layout.servers
    assert chat.env == (("VLLM_CPU_OMP_THREADS_BIND", "0"),)
    assert batch.env == (("VLLM_CPU_OMP_THREADS_BIND", "1"),)
    assert chat.command[:4] == ("taskset", "-c", "0", "bash")
    assert batch.command[:3] == ("taskset", "-c", "1") and layout.note == ""
    assert chat.command[4].endswith("vllm-cpu.sh") and chat.command[5:7] == ("/m", "9001")
    assert chat.command[-2:] == ("--scheduling-policy", "priority")
    assert layout.targets == {"interactive": (0, "peer"), "batch": (1, "peer")}
    unpinned = vllm_layout(_config(tmp_path, pin=False, dtype="float32"), Path("/m"), (1, 2))
    assert unpinned.servers[0].env == () and unpinned.note.startswith("not pinned to cores; ")
    assert unpinned.servers[0].command[0] == "bash"
    monkeypatch.setattr(bench_models.shutil, "which", lambda name: None)
    bare = vllm_layout(_config(tmp_path), Path("/m"), (1, 2))
    assert bare.servers[0].env and bare.note == "threads bound, processes not pinned (no taskset)"
    assert core_of("cpu:1") == 1 and core_of("cuda:0") is None


def test_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="layouts must be some of slice, static, vllm"):
        ModelsBenchConfig(out=tmp_path, layouts=("slice", "tgi"))
    with pytest.raises(ValueError, match="two devices"):
        ModelsBenchConfig(out=tmp_path, devices=("cpu:0", "cpu:0"))
    with pytest.raises(ValueError, match="closed loop"):
        ModelsBenchConfig(out=tmp_path, batch="rate=1,prompt=8,gen=8")
    with pytest.raises(ValueError, match="--max-requests and --span-s cut"):
        ModelsBenchConfig(out=tmp_path, max_requests=5, interactive="synthetic-coding")
    assert main(["bench-models", "--devices", "cpu:0", "--out", str(tmp_path)]) == 2


def _summary(att: float, lp: float) -> dict[str, object]:
    return {"hp_requests": 279, "hp_slo_attainment": att, "hp_ttft_p50_s": 0.1,
            "hp_ttft_p90_s": 0.2, "hp_ttft_p99_s": 0.4, "hp_tpot_p50_s": 0.05, "lp_tok_s": lp,
            "total_tok_s": lp + 20, "errors": 0}


def test_the_table_ratios_and_goals() -> None:
    outcomes = {"slice": RunOutcome("slice", _summary(0.995, 70.0)),
                "static": RunOutcome("static", _summary(0.9, 50.0)),
                "vllm": RunOutcome("vllm", _summary(0.99, 75.0))}
    summary = models_summary(outcomes)
    assert summary["runs"]["slice"]["batch_x_static"] == pytest.approx(1.4)
    assert summary["runs"]["slice"]["batch_x_vllm"] == pytest.approx(70 / 75)
    assert summary["goals"] == {"interactive_slo_attainment": True, "batch_x_static": True,
                                "attainment_above_vllm": True, "batch_above_vllm": False}
    lines = goal_lines(summary)
    assert lines[1] == "- slice: batch model tok/s 1.40× the static split's >= 1.25×: met"
    assert lines[3] == "- slice: batch model tok/s above two vLLM servers' (0.93×): MISSED"
    alone = models_summary({"slice": RunOutcome("slice", _summary(0.98, 70.0))})
    assert alone["goals"]["batch_x_static"] is None
    assert alone["goals"]["interactive_slo_attainment"] is False


def test_layouts_on_stub_servers(tmp_path: Path) -> None:
    """The slice and static layouts on `python -m loadgen stub`; vLLM's script is missing."""
    config = ModelsBenchConfig(
        out=tmp_path / "out", model="tiny-random", peers_dir=tmp_path / "no-peers",
        serve_cmd=(sys.executable, "-m", "loadgen", "stub", "--step-ms", "2"), **TINY)
    doc = run_models_bench(config)
    assert {n: r["status"] for n, r in doc["runs"].items()} == {
        "slice": "ok", "static": "ok", "vllm": "failed"}
    for name in ("slice", "static"):
        run = doc["summary"]["runs"][name]
        assert run["hp_requests"] == 10 and run["lp_tok_s"] > 0 and run["errors"] == 0
        assert (tmp_path / "out" / "runs" / name / "batch" / "report.json").is_file()
        assert (tmp_path / "out" / "runs" / name / "interactive" / "ttft_cdf.png").is_file()
    assert doc["summary"]["runs"]["static"]["batch_x_static"] == pytest.approx(1.0)
    assert len(doc["runs"]["static"]["servers"]) == 2
    markdown = (tmp_path / "out" / "bench.md").read_text()
    assert "| vllm | did not run: vllm-chat exited with code" in markdown
    assert "- slice: batch model tok/s" in markdown and "--model chat=tiny-random" in markdown
    assert "## Servers" in markdown and markdown.count("- static: `") == 2
