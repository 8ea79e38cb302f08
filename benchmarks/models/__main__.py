"""`python -m benchmarks.models chain|first-runs|compiled|grammar|lora|verify [--json FILE] ...`."""

from __future__ import annotations

from benchmarks.harness import Bench, dispatch
from benchmarks.models import chain, compiled, first_runs, grammar, lora, verify

BENCHES: dict[str, Bench] = {
    "chain": chain.main, "first-runs": first_runs.main, "compiled": compiled.main,
    "grammar": grammar.main, "lora": lora.main, "verify": verify.main}


def main(argv: list[str] | None = None) -> None:
    dispatch("python -m benchmarks.models", BENCHES, argv, errors=(ValueError, FileNotFoundError))


if __name__ == "__main__":
    main()
