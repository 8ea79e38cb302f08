"""The scheduler's benches: ``python -m benchmarks.scheduler overhead|estimators|simulator|
policies|capacity|scaling|provisioning [--json FILE] ...``."""
