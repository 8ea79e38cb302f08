"""A model chain split over cpu:0 and cpu:1 with Recv/Send gives the one-device output."""

from __future__ import annotations

import torch

from executors.types import OpInstance, OpRole, OpState
from models.batch import SeqSpec, build_batch
from models.generate import chain_logits, generate, run_chain
from models.kv_cache import blocks_for
from models.loader import Model
from tests.executors.chains import (
    BLOCK,
    GREEDY,
    Sink,
    chain_ops,
    executors,
    make_rig,
    poll,
    prefill,
    prompts,
)

DEVICES = ["cpu:0", "cpu:1"]


def _last_hidden(ops: list[OpInstance]) -> torch.Tensor:
    layers = [op for op in ops if op.role is OpRole.COMPUTE and op.name.startswith("layers")]
    return layers[-1].output


def test_split_chain_gives_the_same_logits_and_tokens(tiny_model: Model) -> None:
    rig = make_rig(tiny_model, DEVICES)
    batch = prefill(rig, prompts(tiny_model, 2, 11))
    ops = chain_ops(tiny_model, batch, ["cpu:0", "cpu:0", "cpu:1", "cpu:1"])
    assert [op.role for op in ops].count(OpRole.SEND) == 1
    sink = Sink()
    with executors(DEVICES, rig.runner, sink) as exs:
        for op in ops:
            exs[op.device].enqueue(op)
        sink.wait_finished(ops)
    assert all(op.state is OpState.DONE for op in ops)
    ref_kv = tiny_model.new_kv_cache(32, BLOCK)
    want = chain_logits(tiny_model, batch, ref_kv)
    got = tiny_model.ops[-1].logits(batch, _last_hidden(ops))  # type: ignore[union-attr]
    torch.testing.assert_close(got, want)
    assert ops[-1].output.tolist() == run_chain(tiny_model, batch, ref_kv).tolist()


def test_split_generation_matches_generate(tiny_model: Model) -> None:
    rig = make_rig(tiny_model, DEVICES)
    prompt = prompts(tiny_model, 1, 9, seed=1)[0]
    table = rig.kv["cpu:0"].allocator.allocate(blocks_for(len(prompt) + GREEDY.max_tokens, BLOCK))
    out: list[int] = []
    feed, past = list(prompt), 0
    sink = Sink()
    with executors(DEVICES, rig.runner, sink) as exs:
        while len(out) < GREEDY.max_tokens:
            seq = SeqSpec("r0", feed, past, table, sample=True, sampling=GREEDY,
                          num_generated=len(out))
            batch = build_batch([seq], BLOCK, torch.device("cpu"))
            ops = chain_ops(tiny_model, batch, ["cpu:1", "cpu:0", "cpu:1", "cpu:0"])
            for op in ops:
                exs[op.device].enqueue(op)
            sink.wait_finished(ops)
            out.append(int(ops[-1].output[0]))
            past, feed = past + len(feed), [out[-1]]
    assert out == generate(tiny_model, prompt, GREEDY).token_ids


def test_recv_retries_until_memory_is_released_while_other_ops_run(tiny_model: Model) -> None:
    rig = make_rig(tiny_model, DEVICES, capacity_bytes=1 << 20)
    split = prefill(rig, prompts(tiny_model, 1, 7, seed=2))
    local = prefill(rig, prompts(tiny_model, 1, 5, seed=3))
    ops = chain_ops(tiny_model, split, ["cpu:0", "cpu:0", "cpu:1", "cpu:1"], rid="split")
    others = chain_ops(tiny_model, local, ["cpu:1"] * 4, rid="local")
    recv = next(op for op in ops if op.role is OpRole.RECV)
    blocker = rig.ledgers["cpu:1"].free_bytes - recv.transfer_bytes + 1
    rig.ledgers["cpu:1"].reserve("kv", blocker)  # the Recv cannot fit yet
    sink = Sink()
    with executors(DEVICES, rig.runner, sink) as exs:
        for op in [*ops, *others]:
            exs[op.device].enqueue(op)
        sink.wait_finished(others)  # cpu:1 keeps running other work meanwhile
        poll(lambda: recv.attempts >= 1)
        assert recv.state is OpState.ISSUED and ops[-1].state is OpState.ISSUED
        rig.ledgers["cpu:1"].release("kv", blocker)
        sink.wait_finished(ops)
    assert recv.state is OpState.DONE and recv.attempts >= 2
    assert rig.ledgers["cpu:1"].used("activations") == recv.transfer_bytes
    ref_kv = tiny_model.new_kv_cache(32, BLOCK)
    assert ops[-1].output.tolist() == run_chain(tiny_model, split, ref_kv).tolist()
