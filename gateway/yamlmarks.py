"""YAML loading that remembers line numbers, so config errors can name the line."""

from __future__ import annotations

from typing import Any

import yaml


class LineDict(dict[Any, Any]):
    """A YAML mapping; `line` is where it starts, `lines[key]` where each key sits (1-based)."""

    line: int
    lines: dict[Any, int]


class LineList(list[Any]):
    """A YAML sequence; `line` is where it starts, `lines[i]` where item i sits (1-based)."""

    line: int
    lines: list[int]


class _LineLoader(yaml.SafeLoader):
    pass


def _mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> LineDict:
    loader.flatten_mapping(node)
    out = LineDict()
    out.line = node.start_mark.line + 1
    out.lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        out[key] = loader.construct_object(value_node, deep=True)
        out.lines[key] = key_node.start_mark.line + 1
    return out


def _sequence(loader: yaml.SafeLoader, node: yaml.SequenceNode) -> LineList:
    out = LineList(loader.construct_object(child, deep=True) for child in node.value)
    out.line = node.start_mark.line + 1
    out.lines = [child.start_mark.line + 1 for child in node.value]
    return out


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)
_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _sequence)


def load_with_lines(text: str) -> Any:
    """Parse one YAML document; mappings and sequences come back as LineDict / LineList.

    Raises `yaml.YAMLError` (with `problem_mark`) on a syntax error.
    """
    return yaml.load(text, Loader=_LineLoader)  # noqa: S506 - a SafeLoader subclass


def line_of(container: Any, key: Any) -> int | None:
    """The 1-based line of `key` in a LineDict (or index in a LineList), if known."""
    if isinstance(container, LineDict):
        return container.lines.get(key, container.line)
    if isinstance(container, LineList) and isinstance(key, int) and key < len(container.lines):
        return container.lines[key]
    return getattr(container, "line", None)
