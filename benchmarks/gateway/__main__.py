"""`python -m benchmarks.gateway features | tenants | tracing [--json FILE] ...`."""

from __future__ import annotations

from benchmarks.gateway import features, tenants, tracing
from benchmarks.harness import Bench, dispatch

BENCHES: dict[str, Bench] = {"features": features.main, "tenants": tenants.main,
                             "tracing": tracing.main}


def main(argv: list[str] | None = None) -> None:
    dispatch("python -m benchmarks.gateway", BENCHES, argv)


if __name__ == "__main__":
    main()
