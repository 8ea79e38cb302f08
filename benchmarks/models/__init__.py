"""The model runtime's benches: ``python -m benchmarks.models chain|first-runs|compiled
[--json FILE] ...``."""
