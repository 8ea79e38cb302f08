"""Public traces: found through $SLICEGATE_TRACES, and a recipe without one says what to do."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadgen import public_traces
from loadgen.__main__ import main
from loadgen.public_traces import (
    AZURE_CODE,
    MOONCAKE_CONVERSATION,
    TRACES_ENV,
    MissingTrace,
    find_trace,
    require_trace,
)

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def no_traces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A machine without any public trace: an empty $SLICEGATE_TRACES, nothing beside the repo."""
    empty = tmp_path / "traces"
    empty.mkdir()
    monkeypatch.setenv(TRACES_ENV, str(empty))
    monkeypatch.setattr(public_traces, "_BESIDE_REPO", tmp_path / "shared" / "traces")
    return empty


def test_a_downloaded_copy_is_found_through_the_env_folder(no_traces: Path) -> None:
    assert find_trace(AZURE_CODE) is None
    downloaded = no_traces / "AzureLLMInferenceTrace_code.csv"  # as downloaded: not gzipped
    downloaded.write_bytes((FIXTURES / "azure_small.csv").read_bytes())
    assert find_trace(AZURE_CODE) == downloaded
    assert require_trace(AZURE_CODE, "x") == downloaded
    (no_traces / "conversation_trace.jsonl").write_text("")  # Mooncake's upstream name
    assert find_trace(MOONCAKE_CONVERSATION) == no_traces / "conversation_trace.jsonl"


def test_a_missing_trace_says_where_it_comes_from_and_how_to_pass_it(no_traces: Path) -> None:
    with pytest.raises(MissingTrace) as info:
        require_trace(AZURE_CODE, "python -m loadgen bench", instead="use --interactive")
    message = str(info.value)
    for part in ("python -m loadgen bench replays the Azure LLM inference trace 2023 (code)",
                 str(no_traces), "https://github.com/Azure/AzurePublicDataset",
                 "data/AzureLLMInferenceTrace_code.csv", "CC BY 4.0", "SLICEGATE_TRACES=DIR",
                 "docs/traces.md", "Or use --interactive."):
        assert part in message


def test_bench_without_the_trace_fails_before_starting_anything(
        no_traces: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--out", str(tmp_path / "bench"), "--peers", "none"]) == 2
    err = capsys.readouterr().err
    assert "error: python -m loadgen bench replays the Azure LLM inference trace" in err
    assert "--interactive synthetic-coding," in err
    assert not (tmp_path / "bench").exists()
