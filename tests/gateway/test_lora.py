"""`--lora` / `--lora-modules` / `model.lora`, and the adapters a server loads at start-up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import models
from gateway.__main__ import build_parser, config_from_args, main
from gateway.config import ConfigError, load_config
from gateway.lora import AdapterStartupError, ModelAdapters, startup_adapters
from tests.models.peft_ref import make_adapter

pytestmark = pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing`:FutureWarning")


def _config(*argv: str) -> dict[str, str]:
    lora: dict[str, str] = config_from_args(build_parser().parse_args(["serve", *argv])).model.lora
    return lora


def test_flags_in_both_spellings_and_the_config_file(tmp_path: Path) -> None:
    assert _config() == {}
    assert _config("--lora", "sql=/a", "--lora", "chat=/b ") == {"sql": "/a", "chat": "/b"}
    vllm = json.dumps({"name": "json", "path": "/c", "base_model_name": "x"})
    assert _config("--lora-modules", "sql=/a", vllm) == {"sql": "/a", "json": "/c"}
    file = tmp_path / "c.yaml"
    file.write_text("model:\n  lora: {sql: /a}\n  lora_reserve_gib: 0.5\n")
    config = config_from_args(build_parser().parse_args(["serve", "--config", str(file)]))
    assert config.model.lora == {"sql": "/a"} and config.model.lora_reserve_gib == 0.5
    assert _config("--config", str(file), "--lora", "b=/b") == {"b": "/b"}  # flags replace


def test_base_model_name_in_vllms_json_form_and_the_config_file() -> None:
    vllm = json.dumps({"name": "json", "path": "/c", "base_model_name": "small"})
    args = build_parser().parse_args(["serve", "--lora-modules", "sql=/a", vllm])
    assert config_from_args(args).model.lora_bases == {"json": "small"}
    config = load_config(None, {"model.lora": {"a": "/a", "b": {"path": "/b",
                                                                  "base_model_name": "small"}}})
    assert config.model.lora == {"a": "/a", "b": "/b"}
    assert config.model.lora_bases == {"b": "small"}


@pytest.mark.parametrize(("value", "problem"), [
    (["sql"], "use NAME=PATH"), (["a=/x", "a=/y"], "named twice"),
    (["bad name=/x"], "adapter name 'bad name'"), (["a="], "non-empty string"),
    ("a=/x", "a mapping"), (["{nope"], "not JSON"),
    ([{"name": "a", "path": "/x", "base": "b"}], "unknown key(s) base"),
    ({"a": {"path": "/x", "base_model_name": 3}}, "base_model_name must be")])
def test_bad_lora_settings_name_the_key(value: object, problem: str) -> None:
    with pytest.raises(ConfigError, match="model.lora") as bad:
        load_config(None, {"model.lora": value})
    assert problem in str(bad.value)
    with pytest.raises(ConfigError, match="lora_reserve_gib"):
        load_config(None, {"model.lora_reserve_gib": -1})


def test_startup_adapters_load_into_the_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = models.load(tiny_model_dir, dtype="float32")
    good = make_adapter(tiny_model_dir, tmp_path / "good", ["q_proj"], 4, 8, seed=1)
    adapters = startup_adapters(ModelAdapters(model), {"good": str(good)}, ("tiny",))
    assert adapters.served() == {"good": str(good)} and model.adapters.names() == ["good"]
    with pytest.raises(AdapterStartupError, match=r"--lora bad=.*has no adapter_config.json"):
        startup_adapters(ModelAdapters(model), {"bad": str(tmp_path)}, ("tiny",))
    with pytest.raises(AdapterStartupError, match="the base model's name"):
        startup_adapters(ModelAdapters(model), {"tiny": str(good)}, ("tiny",))


def test_a_bad_adapter_stops_the_server_with_status_2(tiny_model_dir: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["serve", "--model", str(tiny_model_dir), "--devices", "cpu:0",
                   "--lora", f"broken={tmp_path}", "--port", "0"])
    assert status == 2
    err = capsys.readouterr().err
    assert "--lora broken=" in err and "has no adapter_config.json" in err
