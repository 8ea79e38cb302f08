"""`python -m models generate` runs the operator chain and matches transformers' greedy output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPT = "Write a Python function that returns the square of a number."


def _cli(*args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "models", "generate", *args, "--json"],
                         check=True, capture_output=True, text=True, timeout=300)
    return json.loads(out.stdout)


def test_greedy_fp32_matches_transformers_generate(default_model_dir: Path) -> None:
    got = _cli("--model", "default", "--prompt", PROMPT, "--chat", "--max-tokens", "32",
               "--dtype", "float32", "--ignore-eos")
    tok = AutoTokenizer.from_pretrained(default_model_dir)
    ids = tok.apply_chat_template([{"role": "user", "content": PROMPT}],
                                  add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    hf = AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.float32).eval()
    want: list[int] = []
    with torch.no_grad():  # greedy, as generate(do_sample=False) does
        x = torch.tensor([ids])
        for _ in range(32):
            nxt = int(hf(x).logits[0, -1].argmax())
            want.append(nxt)
            x = torch.cat([x, torch.tensor([[nxt]])], dim=1)
    assert got["token_ids"] == want
    assert got["text"] == tok.decode(want, skip_special_tokens=True)


def test_seeded_sampling_repeats(tiny_model_dir: Path) -> None:
    args = ("--model", str(tiny_model_dir), "--prompt", "hello world", "--max-tokens", "12",
            "--temperature", "1.0", "--top-p", "0.9", "--top-k", "50", "--seed", "7",
            "--ignore-eos")
    first, second = _cli(*args), _cli(*args)
    assert first["token_ids"] == second["token_ids"]
    assert len(first["token_ids"]) == 12
    assert first["finish_reason"] == "length"
