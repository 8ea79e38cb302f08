"""Benchmarks: commands that print a table and write JSON, outside the runtime packages.

``python -m benchmarks.scheduler NAME ...`` and ``python -m benchmarks.models NAME ...``;
`benchmarks.harness` holds what every bench shares. They import the runtime packages,
which never import them.
"""
