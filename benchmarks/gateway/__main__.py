"""`python -m benchmarks.gateway features | tenants | tracing | small-devices [--json FILE] ...`."""

from __future__ import annotations

from benchmarks.gateway import features, small_devices, tenants, tracing
from benchmarks.harness import Bench, dispatch

BENCHES: dict[str, Bench] = {"features": features.main, "tenants": tenants.main,
                             "tracing": tracing.main, "small-devices": small_devices.main}


def main(argv: list[str] | None = None) -> None:
    dispatch("python -m benchmarks.gateway", BENCHES, argv)


if __name__ == "__main__":
    main()
