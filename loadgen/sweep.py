"""`bench --sweep`: slicegate runs of the same workload, each with its own server flags.

A sweep is a list of settings, each a run name and the flags its `slicegate serve` gets
beside the bench's own (`--serve-arg`); every run uses the `slice` policy, and its row
lands in the bench's tables beside the policies' and peers'. Written
``NAME=FLAGS;NAME=FLAGS`` (flags split as a shell would), or a preset's name.

The ``granularity`` preset is issue 41's sensitivity analysis of operator granularity
(docs/granularity.md) for a 30-layer model (the default, SmolLM2-135M): fixed groups of
2, 5 (the default split), 10 and 30 layers per operator, and the adaptive setting that
runs interactive work on 10-layer operators and chooses 2 or 10 per low plan. The
``chunks`` preset sweeps the prefill chunk (`--max-num-batched-tokens`) at the default
granularity.
"""

from __future__ import annotations

import shlex

Setting = tuple[str, tuple[str, ...]]  # (run name, its extra serve flags)

PRESETS: dict[str, str] = {
    "granularity": ("lpg2=--layers-per-group 2;lpg5=--layers-per-group 5;"
                    "lpg10=--layers-per-group 10;lpg30=--layers-per-group 30;"
                    "adaptive-2-10=--layer-groups 2,10"),
    # NOTE: the prefill chunk: prompt tokens in one plan (the default 2048 runs every
    # prompt of the saturating mix whole)
    "chunks": ("mbt256=--max-num-batched-tokens 256;mbt512=--max-num-batched-tokens 512;"
               "mbt1024=--max-num-batched-tokens 1024;mbt2048=--max-num-batched-tokens 2048"),
}


def parse_sweep(text: str) -> tuple[Setting, ...]:
    """``NAME=FLAGS;...`` or a preset's name to settings. ValueError for an empty or
    repeated name, a name that is not one path component, or a setting without flags."""
    text = PRESETS.get(text.strip(), text)
    settings: list[Setting] = []
    for item in (i.strip() for i in text.split(";")):
        if not item:
            continue
        name, sep, flags = item.partition("=")
        name = name.strip()
        if not sep or not flags.strip():
            raise ValueError(f"sweep setting {item!r}: NAME=FLAGS, e.g. lpg2=--layers-per-group "
                             f"2 (or a preset: {', '.join(PRESETS)})")
        if not name or "/" in name or name.startswith(".") or " " in name:
            raise ValueError(f"sweep setting {item!r}: the name must be one word")
        if any(name == n for n, _ in settings):
            raise ValueError(f"sweep setting {name!r} is named twice")
        settings.append((name, tuple(shlex.split(flags))))
    if not settings:
        raise ValueError("an empty sweep: give NAME=FLAGS;... or a preset "
                         f"({', '.join(PRESETS)})")
    return tuple(settings)


def sweep_lines(settings: tuple[Setting, ...]) -> list[str]:
    """The bench.md section naming each sweep run's flags (its figures are in the tables)."""
    if not settings:
        return []
    return ["## Sweep", "", "Each run is `slice` with these flags beside the bench's own:", "",
            "| run | flags |", "|---|---|",
            *(f"| {name} | `{shlex.join(flags)}` |" for name, flags in settings), ""]
