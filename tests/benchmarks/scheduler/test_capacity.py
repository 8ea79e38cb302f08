import json
from pathlib import Path

from benchmarks.scheduler.capacity import VLLM_CPU_BLOCK_SIZE, vllm_blocks
from models.kv_cache import KVCache


def _folder(tmp_path: Path, **config: int) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_vllm_gets_the_blocks_that_fit_in_the_same_bytes(tmp_path: Path) -> None:
    import torch

    folder = _folder(tmp_path, num_hidden_layers=30, num_key_value_heads=3,
                     hidden_size=576, num_attention_heads=9)
    per_block = KVCache.bytes_per_block(30, VLLM_CPU_BLOCK_SIZE, 3, 64, torch.bfloat16)
    assert vllm_blocks(folder, 10 * per_block) == 10
    assert vllm_blocks(folder, 10 * per_block - 1) == 9


def test_an_explicit_head_dim_wins(tmp_path: Path) -> None:
    folder = _folder(tmp_path, num_hidden_layers=2, num_key_value_heads=1,
                     hidden_size=64, num_attention_heads=4, head_dim=32)
    assert vllm_blocks(folder, 2 * 2 * 1 * 32 * 2 * VLLM_CPU_BLOCK_SIZE * 3) == 3
