"""The operator chain over paged KV equals transformers' own forward (fp32)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    MistralConfig,
    PretrainedConfig,
    Qwen2Config,
)

import models
from models.batch import SeqSpec, build_batch
from models.generate import chain_logits
from models.kv_cache import KVCache, blocks_for

BLOCK = 4  # small blocks so every sequence spans several


def _llama(**kw: object) -> LlamaConfig:
    base: dict[str, object] = dict(vocab_size=97, hidden_size=48, intermediate_size=96,
                                   num_hidden_layers=3, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=12,
                                   max_position_embeddings=256, tie_word_embeddings=False)
    base.update(kw)
    return LlamaConfig(**base)


CONFIGS: dict[str, PretrainedConfig] = {
    "llama-gqa2-untied": _llama(),
    "llama-mha-tied": _llama(num_key_value_heads=4, tie_word_embeddings=True),
    "llama-gqa4-rope-llama3": _llama(num_key_value_heads=1, rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    "llama-rope-linear": _llama(rope_parameters={"rope_type": "linear", "rope_theta": 10000.0,
                                                 "factor": 2.0}),
    "mistral-no-sliding-window": MistralConfig(vocab_size=97, hidden_size=48,
                                               intermediate_size=96, num_hidden_layers=3,
                                               num_attention_heads=4, num_key_value_heads=2,
                                               head_dim=12, max_position_embeddings=256,
                                               sliding_window=None),
    "qwen2-gqa2-bias": Qwen2Config(vocab_size=97, hidden_size=48, intermediate_size=96,
                                   num_hidden_layers=3, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=256,
                                   tie_word_embeddings=False),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
         ) -> tuple[torch.nn.Module, models.Model]:
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(CONFIGS[request.param], dtype=torch.float32).eval()
    with torch.no_grad():  # random biases, so the Qwen2 bias path is really exercised
        for name, p in hf.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)
    path: Path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    return hf, models.load(path, dtype="float32", layers_per_group=2)


def _hf_last_logits(hf: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float()  # [n, V]


class Seqs:
    """Block tables and token histories of a few requests on one KV cache."""

    def __init__(self, model: models.Model, n: int) -> None:
        self.kv: KVCache = model.new_kv_cache(256, BLOCK)
        self.tables: list[list[int]] = [[] for _ in range(n)]
        self.hist: list[list[int]] = [[] for _ in range(n)]

    def spec(self, i: int, tokens: list[int]) -> SeqSpec:
        past = len(self.hist[i])
        self.kv.allocator.append(self.tables[i], past + len(tokens))
        self.hist[i] += tokens
        return SeqSpec(f"r{i}", tokens, past, self.tables[i], sample=True)


def _run(model: models.Model, seqs: list[SeqSpec], kv: KVCache,
         all_rows: bool = False) -> torch.Tensor:
    batch = build_batch(seqs, BLOCK, model.device)
    if all_rows:
        batch.sample_rows = torch.arange(batch.shape.num_tokens)
    return chain_logits(model, batch, kv)


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 97, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_prefill_all_positions(pair: tuple[torch.nn.Module, models.Model]) -> None:
    hf, model = pair
    s = Seqs(model, 1)
    ids = _tokens(13, 1)
    got = _run(model, [s.spec(0, ids)], s.kv, all_rows=True)
    torch.testing.assert_close(got, _hf_last_logits(hf, ids), rtol=1e-4, atol=1e-4)


def test_mixed_batch_of_three_lengths(pair: tuple[torch.nn.Module, models.Model]) -> None:
    hf, model = pair
    s = Seqs(model, 3)
    prompts = [_tokens(n, 10 + n) for n in (5, 11, 2)]
    got = _run(model, [s.spec(i, p) for i, p in enumerate(prompts)], s.kv)
    want = torch.stack([_hf_last_logits(hf, p)[-1] for p in prompts])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_chunked_prefill_beside_a_decode(pair: tuple[torch.nn.Module, models.Model]) -> None:
    hf, model = pair
    s = Seqs(model, 2)
    a, b = _tokens(14, 2), _tokens(6, 3)
    _run(model, [s.spec(0, a[:5]), s.spec(1, b)], s.kv)
    # chunk 2 of request 0 on top of its KV, in one batch with a decode step of request 1
    got = _run(model, [s.spec(0, a[5:]), s.spec(1, [7])], s.kv, all_rows=True)
    torch.testing.assert_close(got[:9], _hf_last_logits(hf, a)[5:], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got[9], _hf_last_logits(hf, b + [7])[-1], rtol=1e-4, atol=1e-4)


def test_sixteen_decode_steps_mixed_contexts(pair: tuple[torch.nn.Module, models.Model]) -> None:
    hf, model = pair
    s = Seqs(model, 3)
    _run(model, [s.spec(i, _tokens(n, 20 + i)) for i, n in enumerate((3, 9, 17))], s.kv)
    for step in range(16):
        nxt = _tokens(3, 100 + step)
        got = _run(model, [s.spec(i, [nxt[i]]) for i in range(3)], s.kv)
        want = torch.stack([_hf_last_logits(hf, s.hist[i])[-1] for i in range(3)])
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_blocks_return_to_pool(pair: tuple[torch.nn.Module, models.Model]) -> None:
    _, model = pair
    s = Seqs(model, 3)
    start = s.kv.allocator.num_free
    _run(model, [s.spec(i, _tokens(n, i)) for i, n in enumerate((4, 9, 1))], s.kv)
    assert s.kv.allocator.num_free == start - sum(blocks_for(n, BLOCK) for n in (4, 9, 1))
    for t in s.tables:
        s.kv.allocator.free(t)
    assert s.kv.allocator.num_free == start
