"""spec-bench: requests through the real gateway app (fake scheduler) with the speculative
field per mode, and the table of medians."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import httpx
import pytest

from gateway.engine import load_tokenizer
from loadgen.__main__ import _parser
from loadgen.specbench import Sample, SpecBenchConfig, drive, markdown, summarize
from models.spec_config import SpecConfig
from tests.gateway.harness import EngineFactory, make_config, record_requests, running

SPEC = SpecConfig(4, 4, 2)


async def test_drive_sends_each_prompt_once_per_mode_and_repeat(tiny_model_dir: Path,
                                                                tmp_path: Path) -> None:
    tok = load_tokenizer(tiny_model_dir)
    words = tuple(sorted(set(tok.encode("the river runs to the ocean", add_special_tokens=False))))
    cfg = SpecBenchConfig(tmp_path, workloads=("code-edit", "chat"), requests=2, repeats=2,
                          max_tokens=6)
    fake = EngineFactory(tok, words)(token_delay_s=0.001, max_model_len=4096)
    engine = dataclasses.replace(fake, max_model_len=4096, speculative=SPEC)
    async with running(make_config(), engine) as h:
        seen = record_requests(h.engine)
        samples = await drive(h.client, "tiny", "slicegate",
                              {"off": {"speculative": False}, "on": {}}, cfg)
    assert len(samples) == 2 * 2 * 2 * 2  # workloads x prompts x modes x repeats
    assert all(s.error is None and s.tokens == 6 for s in samples), samples[0]
    assert all(s.tpot_s is not None and s.tpot_s > 0 for s in samples)
    assert [s.mode for s in samples[:2]] == ["off", "on"]
    assert [s.mode for s in samples[8:10]] == ["on", "off"]  # the order alternates
    # after the warm-up, "off" asks for no drafts, "on" runs with the server's config
    assert [r.speculative for r in seen[1:3]] == [None, SPEC]


def test_the_table_gives_medians_and_the_ratio_to_off(tmp_path: Path) -> None:
    def s(mode: str, tpot_ms: float) -> Sample:
        return Sample("slicegate", mode, "code-edit", "p", 0, tokens=11, first_s=0.1,
                      last_s=0.1 + 10 * tpot_ms / 1e3)
    rows = summarize([s("off", 10), s("off", 20), s("off", 30), s("on", 5), s("on", 6)])
    on = next(r for r in rows if r["mode"] == "on")
    assert on["tpot_p50_ms"] == pytest.approx(5.5) and on["tpot_vs_off"] == pytest.approx(0.275)
    table = markdown(rows, {"vllm": {"status": "failed", "error": "ngram unsupported"}})
    assert "| slicegate | on | code-edit | 2 |" in table and "ngram unsupported" in table


def test_the_command_line() -> None:
    args = _parser().parse_args(["spec-bench", "--requests", "2", "--peers", "none"])
    assert args.requests == 2 and args.peers == "none"
    with pytest.raises(ValueError):
        SpecBenchConfig(Path("x"), spec="{bad")


def test_samples_without_tokens_have_no_tpot() -> None:
    assert Sample("s", "on", "chat", "p", 0).tpot_s is None
    assert httpx  # the client library the bench drives servers with
