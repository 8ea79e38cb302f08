"""GatewayConfig: defaults, YAML/TOML files, CLI overrides, validation, the CLI's exits."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import gateway.__main__
from gateway.__main__ import build_parser, config_from_args, main
from gateway.batches.service import lock_data_dir
from gateway.config import ConfigError, GatewayConfig, ServerSettings, load_config
from gateway.engine import scheduler_config
from tests.gateway.harness import TENANTS_YAML

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_defaults() -> None:
    config = GatewayConfig()
    assert config.model.spec == "default" and config.served_model_name == "default"
    assert config.scheduler.devices == ("cpu:0", "cpu:1")  # no GPU on the test machine
    assert (config.server.host, config.server.port) == ("127.0.0.1", 8000)
    assert not config.tenants.auth_enabled
    assert config.batch.data_dir is None and config.batch.max_file_lines == 50_000


async def test_data_dir_from_flag_env_or_user_data_dir(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    args = build_parser().parse_args(["serve", "--data-dir", str(tmp_path / "d")])
    assert config_from_args(args).batch.resolved_data_dir == str(tmp_path / "d")
    monkeypatch.setenv("SLICEGATE_DATA_DIR", str(tmp_path / "env"))
    assert GatewayConfig().batch.resolved_data_dir == str(tmp_path / "env")
    monkeypatch.delenv("SLICEGATE_DATA_DIR")
    assert GatewayConfig().batch.resolved_data_dir.endswith("slicegate")
    with pytest.raises(ConfigError, match="batch.max_waiting"):
        load_config(None, {"batch.max_waiting": 0})


async def test_prefix_cache_flag() -> None:
    on = config_from_args(build_parser().parse_args(["serve"]))
    off = config_from_args(build_parser().parse_args(["serve", "--no-prefix-cache"]))
    assert on.scheduler.prefix_cache and not off.scheduler.prefix_cache
    assert not scheduler_config(off.scheduler, 512).prefix_caching
    with pytest.raises(ConfigError, match="scheduler.prefix_cache"):
        load_config(None, {"scheduler.prefix_cache": "no"})


async def test_reprofile_flag() -> None:
    on = config_from_args(build_parser().parse_args(["serve"]))
    off = config_from_args(build_parser().parse_args(["serve", "--no-reprofile"]))
    assert on.scheduler.reprofile and not off.scheduler.reprofile
    assert scheduler_config(on.scheduler, 512).reprofile
    assert not scheduler_config(off.scheduler, 512).reprofile
    with pytest.raises(ConfigError, match="scheduler.reprofile"):
        load_config(None, {"scheduler.reprofile": "off"})


async def test_wide_prefill_flag() -> None:
    on = config_from_args(build_parser().parse_args(["serve"]))
    off = config_from_args(build_parser().parse_args(["serve", "--no-wide-prefill"]))
    assert scheduler_config(on.scheduler, 512).wide_prefill
    assert not scheduler_config(off.scheduler, 512).wide_prefill
    with pytest.raises(ConfigError, match="scheduler.wide_prefill"):
        load_config(None, {"scheduler.wide_prefill": "yes"})


async def test_yaml_file_then_cli_overrides(tmp_path: Path) -> None:
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(TENANTS_YAML)
    path = tmp_path / "gateway.yaml"
    path.write_text(f"model: {{spec: tiny-random, max_model_len: 512}}\n"
                    f"scheduler: {{devices: 'cpu:0,cpu:1,cpu:2', policy: fcfs}}\n"
                    f"server: {{port: 9000, drain_timeout_s: 5}}\n"
                    f"tenants_file: {tenants}\n")
    args = build_parser().parse_args(["serve", "--config", str(path), "--port", "9100",
                                      "--devices", "cpu:3", "--served-model-name", "m"])
    config = config_from_args(args)
    assert config.model.spec == "tiny-random" and config.model.max_model_len == 512
    assert config.served_model_name == "m"
    assert config.model.generation_config == "auto"  # as vLLM: the model folder's defaults
    none = config_from_args(build_parser().parse_args(["serve", "--generation-config", "none"]))
    assert none.model.generation_config == "none"
    assert config.scheduler.devices == ("cpu:3",) and config.scheduler.policy == "fcfs"
    assert config.server.port == 9100 and config.server.drain_timeout_s == 5
    assert config.tenants.tenant_for("sk-ide-1") is not None


async def test_toml_file(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text('[model]\nspec = "x"\ndtype = "float32"\n[scheduler]\ndevices = ["cpu:0"]\n')
    config = load_config(path)
    assert config.model.dtype == "float32" and config.scheduler.devices == ("cpu:0",)


@pytest.mark.parametrize(("text", "message"), [
    ("modle: {}\n", "unknown config key"),
    ("model: {sepc: x}\n", "model: unknown key"),
    ("model: {dtype: int8}\n", "model.dtype"),
    ("scheduler: {devices: 'gpu:0'}\n", "scheduler.devices"),
    ("scheduler: {devices: 'cpu:0,cpu:0'}\n", "twice"),
    ("scheduler: {policy: random}\n", "scheduler.policy"),
    ("scheduler: {provisioning: auto}\n", "scheduler.provisioning"),
    ("scheduler: {provision_interval_s: 0}\n", "scheduler.provision_interval_s"),
    ("server: {port: 70000}\n", "server.port"),
    ("server: {drain_timeout_s: 0}\n", "server.drain_timeout_s"),
    ("model: 5\n", "model: expected a mapping"),
    ("model: {generation_config: ''}\n", "model.generation_config"),
    ("scheduler: {devices: 'box/cpu:0'}\n", "give --ray-address"),
    ("scheduler: {devices: 'ray:all'}\n", "give --ray-address"),
    ("scheduler: {devices: 'cpu:0', ray_address: auto}\n", "every device is NODE/cpu:N"),
    ("scheduler: {devices: 'ray:all,box/cpu:0', ray_address: auto}\n", "stands alone|NODE/"),
])
async def test_invalid(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(path)


async def test_ray_address_defaults_to_every_device_of_the_cluster() -> None:
    args = build_parser().parse_args(["serve", "--ray-address", "auto"])
    assert config_from_args(args).scheduler.devices == ("ray:all",)
    args = build_parser().parse_args(["serve", "--ray-address", "10.0.0.2:6379", "--devices",
                                      "10.0.0.2/cpu:0,10.0.0.3/cuda:1"])
    s = config_from_args(args).scheduler
    assert s.devices == ("10.0.0.2/cpu:0", "10.0.0.3/cuda:1") and s.ray_address == "10.0.0.2:6379"


async def test_cpu_threads_flag() -> None:
    args = build_parser().parse_args(["serve", "--devices", "cpu:0", "--cpu-threads", "1"])
    assert config_from_args(args).scheduler.cpu_threads == 1
    assert GatewayConfig().scheduler.cpu_threads is None  # the cores split between devices


async def test_provisioning_flags_reach_the_scheduler() -> None:
    args = build_parser().parse_args(["serve", "--provisioning", "opscale",
                                      "--provision-interval-s", "0.5"])
    cfg = scheduler_config(config_from_args(args).scheduler, 1024)
    assert cfg.provisioning == "opscale" and cfg.provision_interval_s == 0.5
    assert scheduler_config(GatewayConfig().scheduler, 1024).provisioning == "off"


async def test_server_settings_validate() -> None:
    with pytest.raises(ConfigError, match="request_timeout_s"):
        ServerSettings(request_timeout_s=-1)


async def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gateway.__main__, "configure_logging", lambda *args: None)
    bad = tmp_path / "tenants.yaml"
    bad.write_text("tenants:\n  - name: x\n    api_keys: [k]\n    priority: urgent\n")
    assert main(["serve", "--tenants", str(bad)]) == 2
    assert f"{bad}:4: tenants[0].priority" in capsys.readouterr().err
    assert main(["serve", "--model", "no/such-model", "--port", "0"]) == 1
    assert "no/such-model" in capsys.readouterr().err


async def test_serve_refuses_a_data_dir_another_server_holds(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    held = lock_data_dir(tmp_path / "data")
    try:
        assert main(["serve", "--data-dir", str(tmp_path / "data")]) == 2
    finally:
        os.close(held)
    assert "another slicegate server uses the data dir" in capsys.readouterr().err


async def test_log_format_and_level_come_from_flags_and_are_validated() -> None:
    args = build_parser().parse_args(["serve", "--log-format", "json", "--log-level", "debug"])
    server = config_from_args(args).server
    assert (server.log_format, server.log_level) == ("json", "debug")
    assert GatewayConfig().server.log_format == "text"
    with pytest.raises(ConfigError, match="server.log_format"):
        ServerSettings(log_format="xml")
    with pytest.raises(ConfigError, match="server.log_level"):
        ServerSettings(log_level="loud")


async def test_operator_granularity_flags_and_keys(tmp_path: Path) -> None:
    args = build_parser().parse_args(["serve", "--layer-groups", "2,10"])
    assert config_from_args(args).model.layer_groups == (10, 2)
    args = build_parser().parse_args(["serve", "--layers-per-group", "3"])
    assert config_from_args(args).model.layers_per_group == 3
    path = tmp_path / "c.yaml"
    path.write_text("model: {layer_groups: [1, 4]}\n")
    assert load_config(path).model.layer_groups == (4, 1)
    for bad, key in (({"model.layers_per_group": 0}, "model.layers_per_group"),
                     ({"model.layers_per_group": True}, "model.layers_per_group"),
                     ({"model.layer_groups": "10"}, "model.layer_groups"),
                     ({"model.layer_groups": "2,10", "model.layers_per_group": 5},
                      "model.layers_per_group"),
                     ({"model.layer_groups": "2,10", "model.models": ["a=default", "b=default"]},
                      "model.layer_groups")):
        with pytest.raises(ConfigError, match=key):
            load_config(None, bad)


async def test_the_prefill_chunk_flag_reaches_the_scheduler() -> None:
    args = build_parser().parse_args(["serve", "--max-num-batched-tokens", "512"])
    config = config_from_args(args)
    assert scheduler_config(config.scheduler, 2048).max_batch_tokens == 512
    assert scheduler_config(GatewayConfig().scheduler, 2048).max_batch_tokens == 2048
    for bad in (8, "512", True):
        with pytest.raises(ConfigError, match="scheduler.max_batch_tokens"):
            load_config(None, {"scheduler.max_batch_tokens": bad})
