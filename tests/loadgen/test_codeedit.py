"""The code-edit and chat workloads (pure)."""

from __future__ import annotations

import pytest

from loadgen.codeedit import MAX_CHARS, code_edit_prompts, workload


def test_code_edit_prompts_hold_a_stdlib_function_and_ask_for_one_rename() -> None:
    prompts = code_edit_prompts(12)
    assert len(prompts) == 12 and len({p.name for p in prompts}) == 12
    assert {p.name.split(".")[0] for p in prompts} >= {"textwrap", "shlex"}
    for p in prompts:
        code = p.content.split("```python\n")[1].split("\n```")[0]
        assert code.startswith("def ") and len(code) <= MAX_CHARS
        assert "renamed to" in p.content
    assert code_edit_prompts(12) == prompts  # deterministic


def test_chat_prompts_and_unknown_workloads() -> None:
    chat = workload("chat", 10)
    assert len(chat) == 10 and "```" not in chat[0].content
    with pytest.raises(ValueError, match="unknown workload"):
        workload("poetry", 2)
