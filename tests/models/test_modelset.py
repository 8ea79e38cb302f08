"""`model_set`: several models' chains laid end to end, names namespaced, KV layout checked."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from models.modelset import model_set
from models.skeleton import skeleton
from models.template import OpKind
from tests.scheduler.cluster import CONFIG, weightless


def test_the_chains_follow_each_other_under_their_models_names() -> None:
    s = model_set([("chat", weightless(), ("cpu:0",)), ("batch", weightless(2), None)])
    t = s.template
    assert [o.name for o in t.chain("chat")] == [
        "chat/embed", "chat/layers[0:1]", "chat/layers[1:2]", "chat/layers[2:3]",
        "chat/layers[3:4]", "chat/head"]
    assert [o.name for o in t.chain("batch")] == [
        "batch/embed", "batch/layers[0:2]", "batch/layers[2:4]", "batch/head"]
    assert [o.index for o in t.ops] == list(range(10))
    assert t.chain("") == t.chain("chat") and t.models == ("chat", "batch")
    assert [o.kind for o in t.chain("batch")][-1] is OpKind.HEAD
    with pytest.raises(KeyError):
        t.chain("other")


def test_each_device_counts_the_weights_of_the_models_that_run_there() -> None:
    one = weightless().template.weight_bytes
    s = model_set([("chat", weightless(), ("cpu:0",)), ("batch", weightless(), None)])
    assert s.weight_bytes_on("cpu:0") == 2 * one and s.weight_bytes_on("cpu:1") == one
    assert s.devices_of(["cpu:0", "cpu:1"]) == {"chat": frozenset({"cpu:0"}),
                                                "batch": frozenset({"cpu:0", "cpu:1"})}
    assert s.member("").name == "chat" and s.member("batch").first == 6


def test_a_model_of_another_kv_layout_or_a_repeated_name_is_refused() -> None:
    other = skeleton(dataclasses.replace(CONFIG, num_layers=6), torch.float32, 1)
    with pytest.raises(ValueError, match="another KV layout"):
        model_set([("chat", weightless(), None), ("big", other, None)])
    with pytest.raises(ValueError, match="another KV layout"):
        model_set([("chat", weightless(), None), ("half", skeleton(CONFIG, torch.bfloat16),
                                                   None)])
    with pytest.raises(ValueError, match="distinct"):
        model_set([("chat", weightless(), None), ("chat", weightless(), None)])
    with pytest.raises(ValueError, match="at least one"):
        model_set([])
