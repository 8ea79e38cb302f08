"""The wheel: built from the repo it holds every package and data file; installed (not
editable) into a fresh venv, its `slicegate serve` answers the openai client.

The fresh venv borrows the dependencies of the venv running the tests through a `.pth` line
(nothing is downloaded). `.pth` files inside a directory added that way are not processed,
so the repo's editable-install finder stays off and slicegate comes from the wheel alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.serve import REPO, GatewayProcess, free_port

# NOTE: files the code reads beside itself (`Path(__file__).parent / ...`); each glob must
# match at least one file of the repo and all of its matches must be in the wheel.
DATA_GLOBS = ("gateway/ui/static/*", "loadgen/data/*.csv", "loadgen/peers/*.sh",
              "models/csrc/*.c", "models/csrc/*.h", "scheduler/sim/csrc/*.c")
_NOT_SOURCE = {".git", ".venv", "build", "dist", "out", "bench-results"}  # at the repo's top


def repo_packages() -> list[str]:
    """Every folder with an `__init__.py` in the repo's top-level folders, but tests/.

    NOTE: a folder counts even where the one above it lacks its `__init__.py`: packages.find
    does not look inside such a folder, and this test should say so."""
    tops = [d for d in REPO.iterdir() if d.is_dir() and not _ignore(str(REPO), [d.name])
            and d.name != "tests"]
    return sorted(init.parent.relative_to(REPO).as_posix()
                  for top in tops for init in top.rglob("__init__.py"))


def _ignore(folder: str, names: list[str]) -> set[str]:
    """What copying the repo leaves out: caches, venvs and earlier builds."""
    top = Path(folder) == REPO
    return {n for n in names if n == "__pycache__" or n.endswith(".egg-info")
            or (top and (n in _NOT_SOURCE or n.startswith(".")))}


def _outside_env() -> dict[str, str]:
    """The environment minus anything that would put the repo on `sys.path`."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return {**env, "HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from a copy of the repo (a stale `build/` cannot leak into it)."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    shutil.copytree(REPO, source, ignore=_ignore)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--no-index", "-q", "-w", str(tmp / "dist"), str(source)],
                   check=True, cwd=tmp, timeout=300)
    (built,) = (tmp / "dist").glob("slicegate-*.whl")
    return built


@pytest.fixture(scope="module")
def names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as zf:
        return set(zf.namelist())


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel installed and this venv's packages as its dependencies."""
    root = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True,
                   timeout=120)
    python = root / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; "
                           "print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True, timeout=60).stdout.strip()
    Path(site, "slicegate-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # NOTE: --ignore-installed: pip sees the editable slicegate through the .pth and must
    # neither skip the wheel nor touch that install.
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                    "--no-deps", "--no-index", "--ignore-installed", str(wheel)],
                   check=True, cwd=root.parent, env=_outside_env(), timeout=300)
    return root


def test_repo_has_packages_to_check() -> None:
    assert {"gateway", "scheduler", "scheduler.policies"} <= {
        p.replace("/", ".") for p in repo_packages()}


def test_wheel_holds_every_package(names: set[str]) -> None:
    missing = [p for p in repo_packages() if f"{p}/__init__.py" not in names]
    assert not missing, f"packages left out of the wheel: {missing}"
    assert not any(n.startswith("tests/") for n in names)


@pytest.mark.parametrize("pattern", DATA_GLOBS)
def test_wheel_holds_the_data_files(names: set[str], pattern: str) -> None:
    files = [f.relative_to(REPO).as_posix() for f in REPO.glob(pattern) if f.is_file()]
    assert files, f"no {pattern} in the repo"
    missing = [f for f in files if f not in names]
    assert not missing, f"data files left out of the wheel: {missing}"


def test_installed_packages_import_from_the_venv(venv: Path, tmp_path: Path) -> None:
    modules = [p.replace("/", ".") for p in repo_packages()]
    code = ("import importlib, sys\n"
            "for m in sys.argv[1:]: print(importlib.import_module(m).__file__)")
    run = subprocess.run([venv / "bin" / "python", "-c", code, *modules], cwd=tmp_path,
                         env=_outside_env(), capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    out = run.stdout.split()
    assert len(out) == len(modules)
    outside = [f for f in out if not Path(f).resolve().is_relative_to(venv.resolve())]
    assert not outside, f"imported from outside the fresh venv: {outside}"


class InstalledGateway(GatewayProcess):
    """The fresh venv's `slicegate serve` on the tiny model, started outside the repo."""

    def __init__(self, slicegate: Path, cwd: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = cwd / "server.log"
        self._log = self.log_path.open("wb")
        cmd = [str(slicegate), "serve", "--model", "tiny-random", "--dtype", "float32",
               "--device-memory-gib", "0.25", "--log-level", "warning",
               "--port", str(self.port)]
        self.proc = subprocess.Popen(cmd, cwd=cwd, env=_outside_env(),
                                     stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT)
        self._wait_healthy(120.0)


@pytest.fixture
def installed_server(venv: Path, tmp_path: Path, tiny_model_dir: Path) -> Iterator[GatewayProcess]:
    server = InstalledGateway(venv / "bin" / "slicegate", tmp_path)
    try:
        yield server
    finally:
        server.close()


def test_slicegate_serve_answers_the_openai_client(installed_server: GatewayProcess) -> None:
    with openai.OpenAI(base_url=f"{installed_server.url}/v1", api_key="none",
                       max_retries=0) as client:
        try:
            done = client.completions.create(model="tiny-random", prompt="Hello there",
                                             max_tokens=6, temperature=0,
                                             extra_body={"ignore_eos": True})
        except openai.APIError as exc:
            pytest.fail(f"{exc}\nthe server's log:\n{installed_server.log()}")
    assert done.usage is not None and done.usage.completion_tokens == 6
    assert done.choices[0].text
