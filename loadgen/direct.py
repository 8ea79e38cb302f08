"""`python -m models direct` in a subprocess: the operator chain timed without a server
(loadgen imports no other slicegate package)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any


def run_models_direct(python: str, model: str, dtype: str, threads: int, repeats: int,
                      cases: list[dict[str, Any]], cases_file: Path) -> list[dict[str, Any]]:
    """Each case (`prompt`, `max_tokens`, anything else passed through) timed `repeats` times
    after a warm-up; the command's `cases` (with `prompt_tokens` and `ttft_s`). RuntimeError
    with its stderr's tail when it fails."""
    cases_file.write_text(json.dumps(cases))
    cmd = [python, "-m", "models", "direct", "--model", model, "--dtype", dtype, "--threads",
           str(threads), "--repeats", str(repeats), "--cases", str(cases_file)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed: {done.stderr.strip()[-800:]}")
    return list(json.loads(done.stdout.strip().splitlines()[-1])["cases"])
