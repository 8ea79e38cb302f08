"""Benchmarks of the serving path over HTTP, one server started per run."""
