"""The co-location model's slowdowns, and their cached table per count of running classes."""

from __future__ import annotations

import itertools

from executors.interference import OP_CLASSES, Interference

INTER = Interference({"cpu:0": "h", "cpu:1": "h"},
                     {("layers", "layers"): 1.3, ("layers", "embed"): 1.45,
                      ("send", "layers"): 1.13, ("head", "send"): 0.5})


def test_factor_adds_the_excess_of_each_other_op() -> None:
    layers, embed = OP_CLASSES.index("layers"), OP_CLASSES.index("embed")
    counts = [1, 2, 0, 0]  # an embedding and two layer groups, this one among them
    assert INTER.factor(layers, counts) == 1.0 + 0.3 + 0.45
    assert INTER.factor(embed, counts) == 1.0  # no slowdown given for it
    assert INTER.factor(-1, counts) == 1.0  # a RECV is never slowed
    assert INTER.slowdown[("head", "send")] == 1.0  # clamped


def test_factors_per_code_equal_factor_and_are_cached() -> None:
    base = 3
    for counts in itertools.product(range(base), repeat=len(OP_CLASSES)):
        code = sum(n * base ** c for c, n in enumerate(counts))
        fac = INTER.factors(base, code)
        assert fac == [INTER.factor(c, list(counts)) for c in range(len(OP_CLASSES))] + [1.0]
        assert INTER.factors(base, code) is fac
        assert INTER.factor_table(base)[code] is fac
    assert INTER.factor_table(4) == {}
