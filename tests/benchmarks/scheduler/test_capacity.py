import json
from pathlib import Path

from benchmarks.scheduler.capacity import VLLM_CPU_BLOCK_SIZE, vllm_blocks
from models.kv_cache import KVCache


def _folder(tmp_path: Path, **config: int) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_vllm_gets_the_blocks_that_fit_in_the_same_bytes(tmp_path: Path) -> None:
    import torch

    folder = _folder(tmp_path, num_hidden_layers=30, num_key_value_heads=3,
                     hidden_size=576, num_attention_heads=9)
    per_block = KVCache.bytes_per_block(30, VLLM_CPU_BLOCK_SIZE, 3, 64, torch.bfloat16)
    assert vllm_blocks(folder, 10 * per_block) == 10
    assert vllm_blocks(folder, 10 * per_block - 1) == 9


def test_an_explicit_head_dim_wins(tmp_path: Path) -> None:
    folder = _folder(tmp_path, num_hidden_layers=2, num_key_value_heads=1,
                     hidden_size=64, num_attention_heads=4, head_dim=32)
    assert vllm_blocks(folder, 2 * 2 * 1 * 32 * 2 * VLLM_CPU_BLOCK_SIZE * 3) == 3


def test_each_repeat_starts_one_run_later() -> None:
    from benchmarks.scheduler.capacity import schedule

    assert schedule(["a", "b", "c"], 2) == [(0, "a"), (0, "b"), (0, "c"),
                                            (1, "b"), (1, "c"), (1, "a")]


def test_medians_skip_repeats_that_did_not_run_and_say_so() -> None:
    from benchmarks.scheduler.capacity import FIGURES, medians

    rows = [{"run": "s", **dict.fromkeys(FIGURES, float(v))} for v in (1, 5, 3)]
    out = medians("s", [*rows, {"run": "s", "note": "did not run: port"}])
    assert out["output_tok_s"] == 3.0 and out["output_tok_s_repeats"] == [1.0, 5.0, 3.0]
    assert out["note"] == "1 of 4 repeats did not run"
    assert medians("s", [{"run": "s", "note": "x"}]) == {"run": "s", "note": "x"}


def test_the_ratio_to_vllm_is_taken_within_each_repeat() -> None:
    from typing import Any

    from benchmarks.scheduler.capacity import ratio_to_vllm

    reps: list[dict[str, dict[str, Any]]] = [
        {"slicegate": {"output_tok_s": 200.0}, "vllm": {"output_tok_s": 100.0}},
        {"slicegate": {"output_tok_s": 90.0}, "vllm": {"output_tok_s": 100.0}},
        {"slicegate": {"output_tok_s": 120.0}, "vllm": {"output_tok_s": 80.0}},
        {"slicegate": {"output_tok_s": 500.0}, "vllm": {"note": "did not run"}}]
    # per repeat 2.0, 0.9, 1.5 (the last has no vLLM run): median 1.5, not 410 / 100
    assert ratio_to_vllm(reps, "slicegate") == 1.5
    assert ratio_to_vllm(reps[3:], "slicegate") is None


def test_only_the_all_cores_vllm_run_reserves_no_core(tmp_path: Path) -> None:
    import argparse

    from benchmarks.scheduler.capacity import _spec

    folder = _folder(tmp_path, num_hidden_layers=30, num_key_value_heads=3,
                     hidden_size=576, num_attention_heads=9)
    a = argparse.Namespace(kv_cache_mib=256.0, vllm_devices=2, model="default")
    default, all_cores = (_spec(a, folder, "vllm", tmp_path / "d"),
                          _spec(a, folder, "vllm-all-cores", tmp_path / "d"))
    assert dict(default.env) == {"VLLM_CPU_KVCACHE_SPACE": "1"}
    assert dict(all_cores.env) == {"VLLM_CPU_KVCACHE_SPACE": "1",
                                   "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    assert all_cores.name == "vllm-all-cores" and "--num-gpu-blocks-override" in all_cores.command
    full = _spec(a, folder, "slicegate-full", tmp_path / "full-1-data").command
    assert "full" in full  # its own data dir: another slicegate may hold the default's lock
    assert full[full.index("--data-dir") + 1] == str(tmp_path / "full-1-data")


def _ev(device: str, op: str, start: float, end: float, seqs: int, tokens: int,
        cpu: float | None) -> dict[str, object]:
    return {"device": device, "op": op, "role": "compute", "start": start, "end": end,
            "cpu": cpu, "num_seqs": seqs, "num_tokens": tokens}


def test_ops_summary_keeps_the_last_window_and_splits_decode_from_prompts() -> None:
    from benchmarks.scheduler.capacity import ops_summary

    events = [_ev("cpu:0", "layers[0:5]", 0.0, 5.0, 1, 400, 5.0),  # before the window
              _ev("cpu:0", "layers[0:5]", 10.0, 13.0, 30, 30, 1.5),  # decode, 3 s
              _ev("cpu:0", "layers[5:10]", 13.0, 14.0, 2, 300, 0.5),  # a prompt, 1 s
              _ev("cpu:1", "layers[0:5]", 12.0, 16.0, 20, 20, None),  # decode, 4 s, untimed
              _ev("cpu:1", "head", 16.0, 18.0, 20, 20, 1.0),
              {**_ev("cpu:1", "send", 18.0, 20.0, 1, 1, 0.0), "role": "send"}]
    out = ops_summary(events, 10.0)
    # devices busy 3 + 1 + 4 + 2 = 10 s of 2 x 10 s; decode 7 of 8 s of layer groups;
    # CPU over wall of the timed ops 3 / 6
    assert out == {"busy": 0.5, "decode_share": 7 / 8, "decode_seqs_p50": 25.0,
                   "cpu_share": 0.5}
    assert ops_summary([], 10.0) == {}


def test_the_one_device_run_gets_both_devices_kv_space(tmp_path: Path) -> None:
    import argparse

    from benchmarks.scheduler.capacity import _spec

    a = argparse.Namespace(kv_cache_mib=256.0, vllm_devices=2, model="default")
    one = _spec(a, tmp_path, "slicegate-one-device", tmp_path / "d").command
    two = _spec(a, tmp_path, "slicegate", tmp_path / "d").command
    assert one[one.index("--devices") + 1] == "cpu:0" and "--devices" not in two
    assert one[one.index("--kv-cache-gib") + 1] == "0.5"
    assert two[two.index("--kv-cache-gib") + 1] == "0.25"


async def test_a_client_counts_only_the_tokens_after_the_warm_up() -> None:
    import random
    import time

    import httpx

    from benchmarks.scheduler.capacity import Load, Tally, _client
    from loadgen.servers import ServerSpec

    class Builder:
        def text(self, num_tokens: int, salt: object) -> str:
            return "hi " * num_tokens

    def sse(request: httpx.Request) -> httpx.Response:
        lines = "".join(f'data: {{"choices": [{{"delta": {{"content": "t{i}"}}}}]}}\n\n'
                        for i in range(300))
        return httpx.Response(200, text=lines + "data: [DONE]\n\n")

    spec = ServerSpec("slicegate", ("x",), 1)
    load = Load(clients=1, min_output=5, max_output=5)
    counts = []
    for warm_in_s in (0.0, 3600.0):
        tally = Tally()
        async with httpx.AsyncClient(transport=httpx.MockTransport(sse),
                                     base_url=spec.url) as http:
            now = time.monotonic()
            stop = now + 0.05  # a few requests of 5 tokens each, then the run ends
            await _client(http, spec, Builder(), random.Random(0), load,  # type: ignore[arg-type]
                          now + warm_in_s, stop, tally, 0)
        assert tally.requests >= 1 and tally.errors == 0
        counts.append((tally.output_tokens, tally.requests))
    (tokens, requests), (warm_tokens, _) = counts
    # each stream read to its planned 5 tokens, all counted (the last one cut by the stop)
    assert 5 * (requests - 1) < tokens <= 5 * requests
    assert warm_tokens == 0  # every token came before the warm-up's end
