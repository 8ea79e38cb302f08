"""LoRA adapters: PEFT folders read and refused, parity with transformers + peft, mixed
batches of base and adapter rows, and the adapter set's add / remove / memory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, LlamaConfig

import models
from models.batch import SeqSpec, build_batch
from models.generate import generate, run_chain
from models.kv_cache import blocks_for
from models.lora import AdapterError, AdapterSet, load_peft_adapter
from models.sampling_params import SamplingParams
from tests.models.peft_ref import ALL, greedy, make_adapter, reference_model

pytestmark = pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing`:FutureWarning")

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [100, 37, 250, 3], [42] * 5 + [17, 300, 301, 302, 9, 8]]
# name -> (targets, r, alpha, extra LoraConfig options, B's scale)
SPECS: dict[str, tuple[list[str], int, float, dict[str, object]]] = {
    "all": (ALL, 8, 16, {}),
    "qv-rs": (["q_proj", "v_proj"], 4, 8, {"use_rslora": True}),
    "mlp": (["gate_proj", "up_proj", "down_proj"], 16, 8, {}),
}


def _greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n)


@pytest.fixture(scope="module")
def tiny_adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
                  ) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-adapters")
    return {name: make_adapter(tiny_model_dir, root / name, t, r, a, seed=i + 1, **kw)
            for i, (name, (t, r, a, kw)) in enumerate(SPECS.items())}


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path, tiny_adapters: dict[str, Path]) -> models.Model:
    model = models.load(tiny_model_dir, dtype="float32", layers_per_group=2)
    for name, path in tiny_adapters.items():
        model.adapters.add(load_peft_adapter(name, path, model))
    return model


def test_adapter_reads_its_config(tiny: models.Model) -> None:
    a, q = tiny.adapters.get("all"), tiny.adapters.get("qv-rs")
    assert a is not None and q is not None
    assert (a.rank, a.scaling, a.targets) == (8, 2.0, ("q", "k", "v", "o", "gate", "up", "down"))
    assert (q.rank, q.scaling, q.targets) == (4, 8 / 4 ** 0.5, ("q", "v"))
    assert a.layers[0]["q"].a.shape == (8, 64) and a.layers[0]["q"].b.shape == (64, 8)
    assert tiny.adapters.names() == ["all", "qv-rs", "mlp"]


@pytest.mark.parametrize("name", [None, *SPECS])
def test_greedy_tokens_equal_peft_on_the_tiny_model(
        tiny: models.Model, tiny_model_dir: Path, tiny_adapters: dict[str, Path],
        name: str | None) -> None:
    ref = reference_model(tiny_model_dir, None if name is None else tiny_adapters[name])
    base = reference_model(tiny_model_dir, None)
    differs = False
    for prompt in PROMPTS:
        got = generate(tiny, prompt, _greedy(12), adapter=name).token_ids
        assert got == greedy(ref, prompt, 12)
        differs |= got != greedy(base, prompt, 12)
    assert differs or name is None, "the adapter should change the tokens (non-zero B)"


def test_greedy_tokens_equal_peft_on_qwen2_with_bias(
        tiny_qwen2_dir: Path, tmp_path: Path) -> None:
    path = make_adapter(tiny_qwen2_dir, tmp_path / "a", ALL, 8, 16, seed=5)
    model = models.load(tiny_qwen2_dir, dtype="float32")
    model.adapters.add(load_peft_adapter("a", path, model))
    ref = reference_model(tiny_qwen2_dir, path)
    for prompt in PROMPTS:
        assert generate(model, prompt, _greedy(10), adapter="a").token_ids == greedy(
            ref, prompt, 10)


def test_greedy_tokens_equal_peft_on_the_default_model(
        default_model_dir: Path, tmp_path: Path) -> None:
    model = models.load(default_model_dir, dtype="float32")
    paths = {"all": make_adapter(default_model_dir, tmp_path / "all", ALL, 8, 16, seed=1,
                                 scale=0.5),
             "qv": make_adapter(default_model_dir, tmp_path / "qv", ["q_proj", "v_proj"], 16,
                                32, seed=2, scale=0.5)}
    for name, path in paths.items():
        model.adapters.add(load_peft_adapter(name, path, model))
    prompts = [[1, 504, 3458, 314, 4649, 30], [28, 9546, 1147, 346, 253, 1345, 2376, 30]]
    for name, path in paths.items():
        ref = reference_model(default_model_dir, path)
        for prompt in prompts:
            got = generate(model, prompt, _greedy(8), adapter=name).token_ids
            assert got == greedy(ref, prompt, 8), (name, prompt)


def _batched(model: models.Model, runs: list[tuple[list[int], str | None]], n: int,
             block: int = 4) -> list[list[int]]:
    """Greedy tokens of every run, all in one batch per step: run i starts at step i, so
    steps mix prefills, decodes, base rows and adapter rows."""
    kv = model.new_kv_cache(256, block)
    tables = [kv.allocator.allocate(blocks_for(len(p) + n, block)) for p, _ in runs]
    outs: list[list[int]] = [[] for _ in runs]
    for step in range(len(runs) + n):
        seqs, live = [], []
        for i, (prompt, adapter) in enumerate(runs):
            if i <= step and len(outs[i]) < n:
                feed = prompt if not outs[i] else outs[i][-1:]
                past = 0 if not outs[i] else len(prompt) + len(outs[i]) - 1
                seqs.append(SeqSpec(f"r{i}", feed, past, tables[i], sample=True,
                                    sampling=_greedy(n), adapter=adapter))
                live.append(i)
        if seqs:
            tokens = run_chain(model, build_batch(seqs, block, model.device), kv)
            for i, t in zip(live, tokens.tolist(), strict=True):
                outs[i].append(t)
    return outs


def test_a_mixed_batch_equals_each_run_alone(tiny: models.Model) -> None:
    runs = [(PROMPTS[0], None), (PROMPTS[1], "all"), (PROMPTS[2], "qv-rs"),
            (PROMPTS[0], "mlp"), (PROMPTS[1], None), (PROMPTS[0], "all")]
    got = _batched(tiny, runs, 8)
    for (prompt, adapter), tokens in zip(runs, got, strict=True):
        assert tokens == generate(tiny, prompt, _greedy(8), adapter=adapter).token_ids


def test_base_rows_are_untouched_by_loaded_adapters(tiny_model_dir: Path, tiny: models.Model
                                                    ) -> None:
    plain = models.load(tiny_model_dir, dtype="float32", layers_per_group=2)
    for prompt in PROMPTS:
        assert (generate(tiny, prompt, _greedy(6)).token_ids
                == generate(plain, prompt, _greedy(6)).token_ids)
    batch = build_batch([SeqSpec("r", PROMPTS[0], 0, list(range(4)), sample=True)], 4,
                        torch.device("cpu"))
    assert not batch.has_adapters


# -- refusals ------------------------------------------------------------------------------

def _edit_config(src: Path, dst: Path, **changes: object) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((dst / "adapter_config.json").read_text())
    cfg.update(changes)
    (dst / "adapter_config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize(("changes", "says"), [
    ({"use_dora": True}, "DoRA"),
    ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
    ({"bias": "lora_only"}, "bias='lora_only'"),
    ({"rank_pattern": {"q_proj": 2}}, "rank_pattern"),
    ({"fan_in_fan_out": True}, "fan_in_fan_out"),
    ({"peft_type": "IA3"}, "not LORA"),
    ({"r": 0}, "positive integer"),
    ({"r": 4}, "not of rank r=4"),  # the tensors are rank 8
])
def test_unsupported_options_are_refused(tiny: models.Model, tiny_adapters: dict[str, Path],
                                         tmp_path: Path, changes: dict[str, object],
                                         says: str) -> None:
    path = _edit_config(tiny_adapters["all"], tmp_path / "x", **changes)
    with pytest.raises(AdapterError) as e:
        load_peft_adapter("x", path, tiny)
    assert says in str(e.value) and "'x'" in str(e.value)


def test_bad_folders_are_refused(tiny: models.Model, tiny_adapters: dict[str, Path],
                                 tmp_path: Path) -> None:
    with pytest.raises(AdapterError, match="is not a folder"):
        load_peft_adapter("x", tmp_path / "nowhere", tiny)
    (tmp_path / "empty").mkdir()
    with pytest.raises(AdapterError, match="no adapter_config.json"):
        load_peft_adapter("x", tmp_path / "empty", tiny)
    (tmp_path / "empty" / "adapter_config.json").write_text("{not json")
    with pytest.raises(AdapterError, match="does not read"):
        load_peft_adapter("x", tmp_path / "empty", tiny)
    (tmp_path / "empty" / "adapter_config.json").write_text('{"r": 8, "lora_alpha": 8}')
    with pytest.raises(AdapterError, match="neither adapter_model.safetensors"):
        load_peft_adapter("x", tmp_path / "empty", tiny)
    (tmp_path / "empty" / "adapter_model.safetensors").write_bytes(b"garbage")
    with pytest.raises(AdapterError, match="weights do not read"):
        load_peft_adapter("x", tmp_path / "empty", tiny)


def test_an_adapter_of_another_base_is_refused(tiny: models.Model, tmp_path: Path) -> None:
    other = tmp_path / "other-base"
    cfg = LlamaConfig(vocab_size=97, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=12)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(other)
    path = make_adapter(other, tmp_path / "a", ALL, 4, 4, seed=3)
    with pytest.raises(AdapterError, match="another base model"):
        load_peft_adapter("x", path, tiny)


def test_targets_outside_the_layers_are_refused(tiny: models.Model,
                                                tiny_adapters: dict[str, Path],
                                                tmp_path: Path) -> None:
    path = _edit_config(tiny_adapters["all"], tmp_path / "x")
    tensors = load_file(path / "adapter_model.safetensors")
    tensors["base_model.model.lm_head.lora_A.weight"] = torch.zeros(8, 64)
    save_file(tensors, path / "adapter_model.safetensors")
    with pytest.raises(AdapterError, match="'base_model.model.lm_head.lora_A.weight' is not"):
        load_peft_adapter("x", path, tiny)


# -- the adapter set -----------------------------------------------------------------------

def test_add_remove_and_memory(tiny: models.Model, tiny_adapters: dict[str, Path]) -> None:
    ad = load_peft_adapter("extra", tiny_adapters["qv-rs"], tiny)
    s = AdapterSet(tiny.lora_shapes(), tiny.num_layers, tiny.dtype)
    assert s.memory_bytes() == 0
    s.add(ad)
    assert "extra" in s and s.names() == ["extra"] and s.get("extra") is ad
    # 4 layers x (q: A 4x64 + B^T 4x128 over the fused q/k/v; v: the same) x 4 bytes
    assert s.memory_bytes() == ad.nbytes + 4 * 2 * 4 * (64 + 128) * 4
    with pytest.raises(AdapterError, match="already loaded"):
        s.add(ad)
    assert s.remove("extra") is ad and s.names() == [] and s.memory_bytes() == 0
    with pytest.raises(AdapterError, match="no adapter named 'extra'"):
        s.remove("extra")


def test_an_adapter_past_the_reserve_is_refused_with_numbers(
        tiny: models.Model, tiny_adapters: dict[str, Path]) -> None:
    ad = load_peft_adapter("extra", tiny_adapters["all"], tiny)
    s = AdapterSet(tiny.lora_shapes(), tiny.num_layers, tiny.dtype)
    s.limit(s.cost_bytes(ad) - 1)
    assert s.can_add(ad) is not None
    with pytest.raises(AdapterError, match=r"needs 0\.\d+ MiB; the adapters' reserve of "):
        s.add(ad)
    s.limit(s.cost_bytes(ad))
    s.add(ad)
    with pytest.raises(AdapterError, match=r"on Ray executors yet \(loaded: extra\)"):
        s.refuse("adapters are not supported on Ray executors yet")
    s.remove("extra")
    s.refuse("adapters are not supported on Ray executors yet")
    with pytest.raises(AdapterError, match="Ray executors"):
        s.add(ad)


def test_a_running_batch_keeps_an_adapter_removed_under_it(
        tiny_model_dir: Path, tiny_adapters: dict[str, Path]) -> None:
    model = models.load(tiny_model_dir, dtype="float32", layers_per_group=2)
    model.adapters.add(load_peft_adapter("a", tiny_adapters["all"], model))
    want = generate(model, PROMPTS[0], _greedy(1), adapter="a").token_ids
    kv = model.new_kv_cache(16, 4)
    table = kv.allocator.allocate(blocks_for(len(PROMPTS[0]), 4))
    batch = build_batch([SeqSpec("r", PROMPTS[0], 0, table, sample=True, sampling=_greedy(1),
                                 adapter="a")], 4, model.device)
    x = model.ops[1].run(batch, model.ops[0].run(batch, None, kv), kv)  # resolves the rows
    model.adapters.remove("a")
    for op in model.ops[2:]:
        x = op.run(batch, x, kv)
    assert x.tolist() == want
    with pytest.raises(AdapterError, match="'a' is not loaded"):
        generate(model, PROMPTS[0], _greedy(1), adapter="a")
