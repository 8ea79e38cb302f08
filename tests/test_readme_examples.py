"""The documentation's examples run as written against a live server, and succeed.

Every fenced code block of README.md and loadgen/README.md that follows a line
`<!-- example -->` is run from the repository root with bash (`-e -o
pipefail`) against one `python -m gateway serve` on the tiny model, started
with the README's tenants file and serving it as `default`. The only change
made to a block is the server's address: `127.0.0.1:8000` becomes the test
server's port. A block fails the test by exiting non-zero or by running past
two minutes (the README promises each example finishes in less).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.serve import REPO, GatewayProcess

DOCS = ("README.md", "loadgen/README.md")
MARK = "<!-- example -->"
ADDRESS = "127.0.0.1:8000"
EXAMPLE_TIMEOUT_S = 120
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.DOTALL | re.MULTILINE)


@dataclass(frozen=True, slots=True)
class Example:
    doc: str
    line: int  # of the marker, 1-based
    code: str

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def examples(doc: str) -> list[Example]:
    """The marked blocks of `doc`; a marker must be followed by a bash block."""
    text = (REPO / doc).read_text(encoding="utf-8")
    found = []
    for match in re.finditer(re.escape(MARK) + r"\n", text):
        line = text.count("\n", 0, match.start()) + 1
        fence = _FENCE.match(text, match.end())
        assert fence is not None and fence.group(1) == "bash", (
            f"{doc}:{line}: {MARK} must be followed directly by a ```bash block")
        found.append(Example(doc, line, fence.group(2)))
    return found


ALL = [e for doc in DOCS for e in examples(doc)]


def test_the_docs_have_their_examples() -> None:
    counts = {doc: sum(e.doc == doc for e in ALL) for doc in DOCS}
    assert counts["README.md"] >= 5 and counts["loadgen/README.md"] >= 1, counts
    assert all(ADDRESS in e.code for e in ALL), "every example talks to the server"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    folder = tmp_path_factory.mktemp("examples")
    log = folder / "server.log"
    # NOTE: its own data dir; the default one may be held by a server running on the machine
    args = ["--model", "tiny-random", "--served-model-name", "default", "--dtype", "float32",
            "--device-memory-gib", "0.25", "--tenants", "examples/tenants.yaml",
            "--data-dir", str(folder / "data")]
    with GatewayProcess(args, log) as process:
        yield process


@pytest.mark.parametrize("example", ALL, ids=[e.id for e in ALL])
def test_example_runs(example: Example, server: GatewayProcess) -> None:
    code = example.code.replace(ADDRESS, f"127.0.0.1:{server.port}")
    proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", code], cwd=REPO,
                          capture_output=True, text=True, timeout=EXAMPLE_TIMEOUT_S,
                          check=False)
    assert proc.returncode == 0, (
        f"{example.id} exited with {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}"
        f"\n--- stderr\n{proc.stderr[-3000:]}\n--- server log\n{server.log()[-3000:]}")
