"""`SpecConfig`: vLLM's --speculative-config for prompt lookup, validated."""

from __future__ import annotations

import pytest

from models.spec_config import SpecConfig


def test_parses_vllms_json_with_its_defaults() -> None:
    c = SpecConfig.from_json('{"method": "ngram", "num_speculative_tokens": 4, '
                             '"prompt_lookup_max": 3, "prompt_lookup_min": 2}')
    assert (c.num_speculative_tokens, c.prompt_lookup_max, c.prompt_lookup_min) == (4, 3, 2)
    assert SpecConfig.from_dict({"num_speculative_tokens": 2}).prompt_lookup_max == 5
    assert SpecConfig.from_dict({"num_speculative_tokens": 2}).prompt_lookup_min == 5
    one = SpecConfig.from_dict({"num_speculative_tokens": 2, "prompt_lookup_max": 3})
    assert (one.prompt_lookup_min, one.prompt_lookup_max) == (3, 3)
    assert SpecConfig.from_dict(c.to_dict()) == c


@pytest.mark.parametrize("text, message", [
    ("not json", "must be JSON"),
    ("[1]", "JSON object"),
    ('{"num_speculative_tokens": 4, "method": "eagle"}', "only 'ngram'"),
    ('{"prompt_lookup_max": 4}', "needs num_speculative_tokens"),
    ('{"num_speculative_tokens": 0}', "num_speculative_tokens must be in"),
    ('{"num_speculative_tokens": 99}', "num_speculative_tokens must be in"),
    ('{"num_speculative_tokens": "4"}', "must be an integer"),
    ('{"num_speculative_tokens": true}', "must be an integer"),
    ('{"num_speculative_tokens": 4, "prompt_lookup_min": 5, "prompt_lookup_max": 2}',
     "prompt_lookup_min"),
    ('{"num_speculative_tokens": 4, "draft_model": "x"}', "unknown"),
])
def test_refuses_what_it_cannot_honour(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SpecConfig.from_json(text)
