"""`model.models` from a config file and `--model NAME=SPEC` flags; bad entries are
ConfigErrors naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.__main__ import build_parser, config_from_args
from gateway.config import ConfigError, load_config
from gateway.model_entries import ModelEntry


def test_a_config_files_models_list(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  models:\n"
                    "    - {name: chat, spec: default, devices: [cpu:0]}\n"
                    "    - {name: batch, spec: tiny-random, dtype: float32,\n"
                    "       devices: 'cpu:0,cpu:1', kv_share: 0.5}\n")
    config = load_config(path)
    assert config.model.models == (ModelEntry("chat", "default", None, ("cpu:0",)),
                                   ModelEntry("batch", "tiny-random", "float32",
                                              ("cpu:0", "cpu:1"), 0.5))
    assert config.served_model_name == "chat"


def test_repeated_model_flags_name_the_models_and_one_spec_stays_one_model() -> None:
    args = build_parser().parse_args(["serve", "--model", "chat=default@cpu:0", "--model",
                                      "batch=default"])
    config = config_from_args(args)
    assert config.model.models == (ModelEntry("chat", "default", None, ("cpu:0",)),
                                   ModelEntry("batch", "default"))
    one = config_from_args(build_parser().parse_args(["serve", "--model", "tiny-random"]))
    assert one.model.spec == "tiny-random" and one.model.models == ()
    assert one.served_model_name == "tiny-random"


def test_model_flags_give_each_model_its_dtype_devices_and_kv_share() -> None:
    args = build_parser().parse_args([
        "serve", "--dtype", "bfloat16", "--model", "chat=default@cpu:0,cpu:1,dtype=float32",
        "--model", "small=tiny-random-qwen2,kv_share=0.5,dtype=bfloat16",
        "--model", "batch=default@cpu:1"])
    config = config_from_args(args)
    assert config.model.models == (
        ModelEntry("chat", "default", "float32", ("cpu:0", "cpu:1")),
        ModelEntry("small", "tiny-random-qwen2", "bfloat16", None, 0.5),
        ModelEntry("batch", "default", None, ("cpu:1",)))
    assert config.model.dtype == "bfloat16"  # for the entries that set none


def test_a_served_model_name_beside_several_models_is_refused() -> None:
    with pytest.raises(ConfigError, match="model.served_model_name"):
        load_config(None, {"model.models": ["chat=default"], "model.served_model_name": "x"})


@pytest.mark.parametrize(("models", "says"), [
    (["chat=default", "chat=default"], "named twice"),
    ([{"name": "chat", "spec": "default", "dtype": "int4"}], "dtype"),
    ([{"name": "chat", "device": "cpu:0"}], "unknown key"),
    ([{"name": " bad", "spec": "default"}], "model name"),
    ([{"name": "chat", "devices": []}], "devices"),
    (["default"], "NAME=SPEC"),
    (["chat=default@"], "devices"),
    ([{"name": "chat", "kv_share": 0}], "kv_share"),
    ([{"name": "chat", "kv_share": "half"}], "kv_share"),
    ("chat=default", "a list"),
    (["chat=default,dtype=int4"], "dtype must be one of bfloat16, float32"),
    (["chat=default,dtype=float32,cpu:1"], "neither a device after '@' nor KEY=VALUE"),
    (["chat=default,cpu:1"], "neither a device"),
    (["chat=default,device=cpu:1"], r"unknown option\(s\) device"),
    (["chat=default,kv_share=half"], "kv_share must be a positive number"),
    (["chat=default,kv_share=0"], "kv_share"),
])
def test_bad_entries_are_config_errors(models: object, says: str) -> None:
    with pytest.raises(ConfigError, match=f"model.models: .*{says}"):
        load_config(None, {"model.models": models})
