"""benchmarks.gateway.features: the variants are interleaved round by round after a warm-up."""

from __future__ import annotations

from benchmarks.gateway.features import VARIANTS, Variant, rounds


def test_rounds_interleave_the_variants_after_one_warm_up() -> None:
    calls: list[str] = []

    def call(v: Variant) -> float:
        calls.append(v.name)
        return float(len(calls))

    variants = list(VARIANTS[:2])
    out = rounds(call, variants, repeats=2)
    names = [v.name for v in variants]
    assert calls == names * 3  # the warm-up round, then two timed rounds
    assert out == {names[0]: [3.0, 5.0], names[1]: [4.0, 6.0]}
