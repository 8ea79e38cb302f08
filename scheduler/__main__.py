"""`python -m scheduler bench overhead|estimators|simulator|policies|capacity|scaling|
provisioning ...`."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

from scheduler.bench import (
    capacity,
    estimators,
    overhead,
    policies,
    provisioning,
    scaling,
    simulator,
)

BENCHES: dict[str, Callable[[list[str] | None], object]] = {
    "overhead": overhead.main, "estimators": estimators.main,
    "simulator": simulator.main, "policies": policies.main, "capacity": capacity.main,
    "scaling": scaling.main, "provisioning": provisioning.main}


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    if len(args) < 2 or args[0] != "bench" or args[1] not in BENCHES:
        sys.exit(f"usage: python -m scheduler bench {{{'|'.join(BENCHES)}}} [--json FILE] ...")
    try:
        BENCHES[args[1]](args[2:])
    except FileNotFoundError as exc:  # a model or a public trace that is not here
        sys.exit(f"error: {exc}")


if __name__ == "__main__":
    main()
