"""`model_set`: several models' chains laid end to end, names namespaced, KV pools by layout."""

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


def test_members_of_one_kv_layout_share_pools_and_another_layout_gets_its_own() -> None:
    other = skeleton(dataclasses.replace(CONFIG, num_layers=6), torch.float32, 1)
    half = skeleton(CONFIG, torch.bfloat16)
    s = model_set([("chat", weightless(), None), ("twin", weightless(2), ("cpu:1",)),
                   ("big", other, ("cpu:0",)), ("half", half, None)],
                  kv_shares={"big": 3.0})
    assert s.model_pools() == {"chat": "", "twin": "", "big": "big", "half": "half"}
    on0, on1 = s.pools_on("cpu:0"), s.pools_on("cpu:1")
    assert {p: share for p, (_, share) in on0.items()} == {"": 1.0, "big": 3.0, "half": 1.0}
    assert {p: share for p, (_, share) in on1.items()} == {"": 2.0, "half": 1.0}
    assert on0["big"][0] is other and on1["half"][0] is half
    assert s.of_op(s.member("big").first).name == "big" and s.of_op(0).name == "chat"
    assert s.of_op(s.member("half").chain[-1]).name == "half"


def test_a_repeated_name_or_no_model_is_refused() -> None:
    with pytest.raises(ValueError, match="distinct"):
        model_set([("chat", weightless(), None), ("chat", weightless(), None)])
    with pytest.raises(ValueError, match="at least one"):
        model_set([])
