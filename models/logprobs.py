"""Log-probabilities of sampled and prompt tokens, for the rows that ask for them.

NOTE: as vLLM v1's default (`logprobs_mode="raw_logprobs"`), they are the log-softmax of
the model's raw logits, before logit bias, penalties, temperature, top-k and top-p: what
the model thinks of a token, whatever the sampling did with it. Natural logarithms, fp32.

The head returns its plain `[S]` tensor of token ids unless a row of its batch asks for
log-probs; then a `HeadOutput`, so every other caller (and the Ray path) sees what it saw.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from models.batch import SeqSpec

_ROWS_PER_SLICE = 256  # prompt rows scored at once: bounds the [rows, V] fp32 buffer


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """One position's token, its log-probability, and the most likely tokens there."""

    token_id: int
    logprob: float  # natural log, under the raw model distribution
    top_ids: tuple[int, ...] = ()  # most likely first; as many as the request asked
    top_logprobs: tuple[float, ...] = ()  # theirs, in the same order


@dataclass(slots=True)
class HeadOutput:
    """The head's output when some row asked for log-probs."""

    token_ids: torch.Tensor  # [S] long, on the CPU
    logprobs: list[TokenLogprobs | None]  # per sampled row; None where it asked for none
    # request id -> its fed rows' next prompt tokens, in order (`SeqSpec.prompt_targets`)
    prompt: dict[str, list[TokenLogprobs]] = field(default_factory=dict)
    # per sampled row, when some row verified drafts: the tokens it emits, in order (the
    # last is `token_ids`' entry); None otherwise (`models.speculative`)
    runs: list[list[int]] | None = None

    def cpu(self) -> HeadOutput:
        return self

    def tolist(self) -> list[int]:
        return list(self.token_ids.tolist())


def scored(logprobs: torch.Tensor, targets: torch.Tensor, k: int) -> list[TokenLogprobs]:
    """Each row's target and its top `k` alternatives."""
    # logprobs: [R, V] float32, targets: [R] long
    chosen = logprobs.gather(1, targets[:, None])[:, 0].tolist()  # [R]
    top_values, top_ids = logprobs.topk(k, -1) if k else (logprobs[:, :0], targets[:, None][:, :0])
    return [TokenLogprobs(t, c, tuple(ids), tuple(vs)) for t, c, ids, vs in zip(
        targets.tolist(), chosen, top_ids.tolist(), top_values.tolist(), strict=True)]


def sampled_logprobs(logits: torch.Tensor, seqs: list[SeqSpec],
                     tokens: list[int]) -> list[TokenLogprobs | None]:
    """The sampled tokens' log-probs, for the rows whose request asks (None for the others)."""
    # logits: [S, V] raw, float32
    rows = [i for i, s in enumerate(seqs) if s.sampling.logprobs is not None]
    out: list[TokenLogprobs | None] = [None] * len(seqs)
    if not rows:
        return out
    index = torch.tensor(rows, device=logits.device)  # [R]
    lp = torch.log_softmax(logits.index_select(0, index), -1)  # [R, V]
    targets = torch.tensor([tokens[i] for i in rows], device=logits.device)  # [R]
    k = max(seqs[i].sampling.logprobs or 0 for i in rows)
    for i, entry in zip(rows, scored(lp, targets, k), strict=True):
        n = seqs[i].sampling.logprobs or 0
        out[i] = TokenLogprobs(entry.token_id, entry.logprob, entry.top_ids[:n],
                               entry.top_logprobs[:n])
    return out


def prompt_rows(seqs: list[SeqSpec]) -> list[tuple[SeqSpec, int]]:
    """(sequence, its first row in the flattened batch) of those that score prompt tokens."""
    out, row = [], 0
    for s in seqs:
        if s.prompt_targets:
            out.append((s, row))
        row += len(s.token_ids)
    return out


def unpack(output: Any) -> tuple[list[int], list[TokenLogprobs | None] | None,
                                 dict[str, list[TokenLogprobs]]]:
    """(token ids, their log-probs or None, prompt log-probs) of a head's output."""
    if isinstance(output, HeadOutput):
        return output.tolist(), output.logprobs, output.prompt
    return list(output.tolist()), None, {}


def runs_of(output: Any) -> list[list[int]] | None:
    """Each sampled row's emitted tokens when the head verified drafts, else None."""
    return output.runs if isinstance(output, HeadOutput) else None


def chunks(start: int, count: int) -> list[tuple[int, int]]:
    """[start, start + count) in slices of at most `_ROWS_PER_SLICE` rows."""
    return [(a, min(a + _ROWS_PER_SLICE, start + count))
            for a in range(start, start + count, _ROWS_PER_SLICE)]
