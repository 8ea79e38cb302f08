"""The import structure the design promises, read from the source with `ast`.

- no import circle between any two modules of the repo's packages;
- the top-level packages import one way: models <- executors <- scheduler <- gateway, and
  benchmarks sit above them all (loadgen talks to a server over HTTP, and imports none);
- inside `scheduler/`, a sub-package imports only those below it in `SCHEDULER_LAYERS`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("models", "executors", "scheduler", "gateway", "loadgen", "benchmarks")
# NOTE: each top-level package may import the ones before it in this order (and itself).
TOP_ORDER = {"models": 0, "executors": 1, "scheduler": 2, "gateway": 3, "loadgen": 3,
             "benchmarks": 4}
# bottom to top; top-level modules of scheduler/ not named here sit above every sub-package
SCHEDULER_LAYERS = ("api", "config", "memory", "cost", "sim", "round", "spec", "policies", "core",
                    "provisioning", "testing")


def modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of the repo's packages."""
    found: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imported(name: str, path: Path) -> Iterator[str]:
    """Every module name an import statement of `path` names (relative ones resolved)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            yield base
            yield from (f"{base}.{a.name}" for a in node.names)


def edges() -> dict[str, set[str]]:
    """Module -> the repo modules it imports (a name resolves to its longest known prefix)."""
    mods = modules()
    out: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        for n in imported(m, path):
            while n and n not in mods:
                n = n.rpartition(".")[0]
            if n and n != m and not m.startswith(n + "."):
                out[m].add(n)
    return out


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def scheduler_layer(module: str) -> int:
    """A scheduler module's place in `SCHEDULER_LAYERS` (past the end: a top-level module)."""
    part = module.split(".")[1] if "." in module else ""
    return SCHEDULER_LAYERS.index(part) if part in SCHEDULER_LAYERS else len(SCHEDULER_LAYERS)


def test_circles_finds_a_circle() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_in_the_repo() -> None:
    assert circles(edges()) == []


def test_top_level_packages_import_one_way() -> None:
    wrong = sorted(f"{m} -> {n}" for m, deps in edges().items() for n in deps
                   if m.split(".")[0] != n.split(".")[0]
                   and TOP_ORDER[n.split(".")[0]] >= TOP_ORDER[m.split(".")[0]])
    assert wrong == []


def test_scheduler_sub_packages_import_only_those_below() -> None:
    wrong = sorted(f"{m} -> {n}" for m, deps in edges().items() if m.startswith("scheduler.")
                   for n in deps if n.startswith("scheduler.")
                   and scheduler_layer(n) > scheduler_layer(m))
    assert wrong == []


def test_every_scheduler_sub_package_has_a_layer() -> None:
    subs = {p.name for p in (REPO / "scheduler").iterdir() if (p / "__init__.py").exists()}
    assert subs <= set(SCHEDULER_LAYERS)
