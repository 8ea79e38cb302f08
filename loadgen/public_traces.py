"""The public traces the benches replay: where each comes from and where a copy is looked for.

The repository ships only its synthetic trace (``loadgen/data``). The public
ones are downloaded by the user (see ``docs/traces.md``) into a folder named
by ``$SLICEGATE_TRACES``; on this project's own machines they also sit in
``../shared/traces`` beside the repository. A recipe that needs one and finds
none fails with ``MissingTrace``, whose message says where to get it and how
to pass it. Stdlib only, like ``loadgen.traces``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

TRACES_ENV = "SLICEGATE_TRACES"
# NOTE: where this project's machines keep them (read-only, beside the repository).
_BESIDE_REPO = Path(__file__).resolve().parents[2] / "shared" / "traces"


class MissingTrace(FileNotFoundError):
    """A recipe needs a public trace that is not on this machine; the message says what to do."""


@dataclass(frozen=True, slots=True)
class PublicTrace:
    """One public trace: the file names a copy may have, its origin and licence."""

    title: str
    names: tuple[str, ...]  # as downloaded, or gzip-compressed
    repository: str  # where to download it from
    path: str  # the file in that repository
    licence: str


AZURE_CODE = PublicTrace(
    "Azure LLM inference trace 2023 (code)",
    ("AzureLLMInferenceTrace_code.csv", "AzureLLMInferenceTrace_code.csv.gz"),
    "https://github.com/Azure/AzurePublicDataset", "data/AzureLLMInferenceTrace_code.csv",
    "CC BY 4.0")
AZURE_CONV = PublicTrace(
    "Azure LLM inference trace 2023 (conversation)",
    ("AzureLLMInferenceTrace_conv.csv", "AzureLLMInferenceTrace_conv.csv.gz"),
    "https://github.com/Azure/AzurePublicDataset", "data/AzureLLMInferenceTrace_conv.csv",
    "CC BY 4.0")
MOONCAKE_CONVERSATION = PublicTrace(
    "Mooncake FAST'25 conversation trace",
    ("conversation_trace.jsonl", "mooncake_FAST25_conversation_trace.jsonl",
     "mooncake_FAST25_conversation_trace.jsonl.gz"),
    "https://github.com/kvcache-ai/Mooncake", "FAST25-release/traces/conversation_trace.jsonl",
    "Apache-2.0")


def trace_dirs() -> list[Path]:
    """Where copies are looked for, in order: ``$SLICEGATE_TRACES``, then ``../shared/traces``."""
    env = os.environ.get(TRACES_ENV)
    return [*([Path(env).expanduser()] if env else []), _BESIDE_REPO]


def find_trace(trace: PublicTrace) -> Path | None:
    """The first copy of ``trace`` in ``trace_dirs()``, or None."""
    for folder in trace_dirs():
        for name in trace.names:
            if (folder / name).is_file():
                return folder / name
    return None


def require_trace(trace: PublicTrace, needed_by: str, instead: str = "") -> Path:
    """The copy of ``trace``; ``MissingTrace`` naming its origin and how to pass it.

    ``needed_by`` names the command; ``instead`` suggests another way to run it.
    """
    path = find_trace(trace)
    if path is not None:
        return path
    looked = ", ".join(str(d) for d in trace_dirs())
    raise MissingTrace(
        f"{needed_by} replays the {trace.title}, and no copy of it was found (looked for "
        f"{' or '.join(trace.names)} in {looked}). Download {trace.path} from "
        f"{trace.repository} ({trace.licence}) into a folder and pass that folder as "
        f"{TRACES_ENV}=DIR (see docs/traces.md)." + (f" Or {instead}." if instead else ""))
