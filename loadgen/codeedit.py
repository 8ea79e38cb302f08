"""The `code-edit` workload: prompts holding a function of Python's own source, asking for it
back with one change (so most of the answer repeats the prompt), and a `chat` workload of
plain questions (little repetition) to compare against.

Functions come from standard-library modules shipped with the interpreter that runs
loadgen (`textwrap.py`, `shlex.py`, ...), read with `ast`: the same Python gives the same
prompts. The change asked for is a rename of one parameter, which a model can follow
while copying the rest.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from pathlib import Path

MODULES = ("textwrap", "shlex", "fnmatch", "colorsys", "bisect")
MIN_CHARS, MAX_CHARS = 300, 1200  # function sizes kept (about 80-350 tokens)
CHAT = ("Explain in a few sentences why the sky is blue.",
        "Write a short poem about a lighthouse keeper.",
        "What are three good habits for learning a new language?",
        "Describe how a bicycle gear system works.",
        "Give me a recipe idea for a quick vegetarian dinner.",
        "Why do cats purr? Answer briefly.",
        "Summarise the plot of a mystery novel you invent, in five sentences.",
        "What should I pack for a weekend hiking trip?")


@dataclass(frozen=True, slots=True)
class Prompt:
    """One chat request of a workload."""

    name: str  # module.function, or chat-N
    content: str  # the user message


def _source(module: str) -> str:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ValueError(f"module {module!r} has no source file")
    return Path(spec.origin).read_text(encoding="utf-8")


def _functions(module: str) -> list[tuple[str, str, str]]:
    """(name, source, a parameter to rename) of its functions of a usable size."""
    text = _source(module)
    out = []
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.FunctionDef):
            continue
        src = ast.get_source_segment(text, node) or ""
        params = [a.arg for a in node.args.args if a.arg not in ("self", "cls")]
        if MIN_CHARS <= len(src) <= MAX_CHARS and params:
            out.append((node.name, src, params[0]))
    return out


def code_edit_prompts(count: int) -> list[Prompt]:
    """`count` code-edit prompts, round-robin over `MODULES`' functions (deterministic)."""
    pools = [[(m, *f) for f in _functions(m)] for m in MODULES]
    pools = [p for p in pools if p]
    out: list[Prompt] = []
    i = 0
    while len(out) < count:
        pool = pools[i % len(pools)]
        module, name, src, param = pool[(i // len(pools)) % len(pool)]
        content = (f"Here is a Python function:\n\n```python\n{src}\n```\n\nReturn the whole "
                   f"function with the parameter `{param}` renamed to `{param}_value` "
                   "everywhere. Reply with the code only.")
        out.append(Prompt(f"{module}.{name}", content))
        i += 1
    return out


def chat_prompts(count: int) -> list[Prompt]:
    """`count` plain chat prompts (little of the answer is in the prompt)."""
    return [Prompt(f"chat-{i}", CHAT[i % len(CHAT)]) for i in range(count)]


def workload(name: str, count: int) -> list[Prompt]:
    if name == "code-edit":
        return code_edit_prompts(count)
    if name == "chat":
        return chat_prompts(count)
    raise ValueError(f"unknown workload {name!r} (known: code-edit, chat)")
