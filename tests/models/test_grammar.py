"""models.grammar: specs compile once, a constraint masks its row only, advances, completes,
and pickles as its step's mask."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from gateway.engine import load_tokenizer
from models.batch import SeqSpec
from models.grammar import GrammarError, Grammars, GrammarSpec, StepMask
from models.numbercap import MAX_NUMBER_CHARS
from models.sampling import sample
from models.sampling_params import SamplingParams

V = 49152


@pytest.fixture(scope="module")
def grammars(default_model_dir: Path) -> Grammars:
    return Grammars(load_tokenizer(default_model_dir), V)


def test_a_choice_masks_its_row_only_and_completes(grammars: Grammars) -> None:
    c = grammars.constraint(GrammarSpec.choice(["yes", "no"]))
    greedy = SamplingParams(temperature=0.0)
    logits = torch.randn(2, V)  # [2, V]
    free = int(logits[1].argmax())
    seqs = [SeqSpec("a", [1], 0, [0], True, greedy, constraint=c),
            SeqSpec("b", [1], 0, [0], True, greedy)]
    token, other = sample(logits, seqs)
    assert other == free and not bool(c.banned()[token])
    while not c.is_complete:
        c.advance(token)
        if not c.is_complete:
            token = sample(torch.randn(1, V), [SeqSpec("a", [1], 0, [0], True, greedy,
                                                       constraint=c)])[0]


def test_specs_compile_once_and_errors_are_the_engine_s(grammars: Grammars) -> None:
    spec = GrammarSpec.json_schema({"type": "object", "properties": {"a": {"type": "integer"}}})
    assert grammars.compile(spec) is grammars.compile(GrammarSpec.json_schema(
        {"properties": {"a": {"type": "integer"}}, "type": "object"}))
    with pytest.raises(GrammarError, match="unclosed character class"):
        grammars.constraint(GrammarSpec("regex", "[0-9"))


def test_a_constraint_pickles_as_its_step_mask(grammars: Grammars) -> None:
    c = grammars.constraint(GrammarSpec("regex", "[0-9]{3}"))
    seq = pickle.loads(pickle.dumps(SeqSpec("a", [1], 0, [0], True, constraint=c)))
    assert isinstance(seq.constraint, StepMask)
    assert torch.equal(seq.constraint.banned(), c.banned())


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_min_tokens_never_leaves_a_constrained_row_nothing_to_sample(
        grammars: Grammars, temperature: float) -> None:
    """Where the grammar allows only a stop token before `min_tokens`, the stop is sampled
    (the grammar ends the request) rather than a banned token or a NaN draw."""
    eos = grammars.tokenizer.eos_token
    params = SamplingParams(temperature=temperature, seed=1, max_tokens=16, min_tokens=12,
                            stop_token_ids=(eos,))
    c = grammars.constraint(GrammarSpec.choice(["yes"]))
    for n in range(16):
        seq = SeqSpec("a", [1], 0, [0], True, params, num_generated=n, constraint=c)
        token = sample(torch.randn(1, V), [seq])[0]
        assert not bool(c.banned()[token]), (n, token)
        if token == eos or c.is_complete:
            break
        c.advance(token)


def test_a_json_number_is_capped_where_the_grammar_can_end_it(grammars: Grammars) -> None:
    c = grammars.constraint(GrammarSpec.json_schema({"type": "object", "properties": {
        "n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False}))
    one = grammars.tokenizer.tokenize_str("1")[-1]
    for token in grammars.tokenizer.tokenize_str('{"n": '):
        c.advance(token)
    for _ in range(MAX_NUMBER_CHARS - 1):
        assert not bool(c.banned()[one])
        c.advance(one)
    assert not bool(c.banned()[one])  # one short of the cap
    c.advance(one)
    banned = c.banned()
    assert bool(banned[one]) and not bool(banned.all())
    close = grammars.tokenizer.tokenize_str("}")[-1]
    assert not bool(banned[close])


def test_a_regex_of_digits_is_not_capped(grammars: Grammars) -> None:
    c = grammars.constraint(GrammarSpec("regex", "[0-9]{40}"))
    one = grammars.tokenizer.tokenize_str("1")[-1]
    for _ in range(30):
        c.advance(one)
    assert not bool(c.banned()[one])
