"""`python -m benchmarks.scheduler overhead|estimators|simulator|policies|pace|capacity|
scaling|provisioning [--json FILE] ...`."""

from __future__ import annotations

from benchmarks.harness import Bench, dispatch
from benchmarks.scheduler import (
    capacity,
    estimators,
    overhead,
    pace,
    policies,
    provisioning,
    scaling,
    simulator,
)

BENCHES: dict[str, Bench] = {
    "overhead": overhead.main, "estimators": estimators.main,
    "simulator": simulator.main, "policies": policies.main, "pace": pace.main,
    "capacity": capacity.main,
    "scaling": scaling.main, "provisioning": provisioning.main}


def main(argv: list[str] | None = None) -> None:
    dispatch("python -m benchmarks.scheduler", BENCHES, argv)


if __name__ == "__main__":
    main()
