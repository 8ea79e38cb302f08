"""PEFT adapters with non-zero random weights, and transformers + peft as the reference."""

from __future__ import annotations

from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, PreTrainedModel

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapter(base_dir: Path, out_dir: Path, targets: list[str], r: int, alpha: float,
                 seed: int, scale: float = 1.0, **kw: object) -> Path:
    """A PEFT adapter of `base_dir` saved in `out_dir`: A and B random (B scaled by `scale`,
    so that the adapter changes the greedy tokens without drowning the base)."""
    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    cfg = LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, init_lora_weights=False,
                     lora_dropout=0.0, **kw)  # type: ignore[arg-type]
    peft = get_peft_model(base, cfg)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, scale / r ** 0.5)
    peft.save_pretrained(out_dir)
    return out_dir


def reference_model(base_dir: Path, adapter_dir: Path | None) -> PreTrainedModel:
    """transformers' fp32 model with the adapter applied by peft (None: the base)."""
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    if adapter_dir is None:
        return base
    return PeftModel.from_pretrained(base, adapter_dir).eval()  # type: ignore[return-value]


@torch.no_grad()
def greedy(model: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    """`n` greedy tokens after `prompt`, each from a full forward (no cache)."""
    ids = list(prompt)
    for _ in range(n):
        logits = model(torch.tensor([ids])).logits[0, -1]
        ids.append(int(logits.argmax()))
    return ids[len(prompt):]
