"""Typed reads of JSON request fields that fail with OpenAI-style 400s naming the param."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from gateway.errors import ApiError, clip, invalid, unsupported

_JSON_TYPES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
               list: "an array", dict: "an object", type(None): "null"}


def type_error(param: str, expected: str, value: Any) -> ApiError:
    got = _JSON_TYPES.get(type(value), type(value).__name__)
    return invalid(param, f"Invalid type for '{param}': expected {expected}, but got {got} "
                          f"instead: {clip(value)}.", code="invalid_type")


def range_error(param: str, rule: str, value: Any) -> ApiError:
    return invalid(param, f"Invalid '{param}': expected a value {rule}, but got {clip(value)} "
                          "instead.", code="invalid_value")


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value))


class Fields:
    """Reads one JSON object's fields; absent and null both mean "use the default"."""

    def __init__(self, body: Mapping[str, Any], prefix: str = "") -> None:
        self.body = body
        self.prefix = prefix

    def name(self, key: str) -> str:
        return f"{self.prefix}{key}"

    def raw(self, key: str) -> Any:
        return self.body.get(key)

    def int_(self, key: str, default: int | None, minimum: int | None = None,
             maximum: int | None = None) -> int | None:
        value = self.body.get(key)
        if value is None:
            return default
        if not is_int(value):
            raise type_error(self.name(key), "an integer", value)
        self._check_range(key, value, minimum, maximum)
        return int(value)

    def float_(self, key: str, default: float, minimum: float | None = None,
               maximum: float | None = None, above: float | None = None) -> float:
        value = self.body.get(key)
        if value is None:
            return default
        if not is_number(value):
            raise type_error(self.name(key), "a number", value)
        if above is not None and not value > above:
            raise range_error(self.name(key), f"> {above}", value)
        self._check_range(key, value, minimum, maximum)
        return float(value)

    def optional_float(self, key: str, minimum: float | None = None,
                       maximum: float | None = None, above: float | None = None) -> float | None:
        """Like `float_`, but None when the field is absent or null."""
        if self.body.get(key) is None:
            return None
        return self.float_(key, 0.0, minimum, maximum, above)

    def bool_(self, key: str, default: bool) -> bool:
        value = self.body.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise type_error(self.name(key), "a boolean", value)
        return value

    def str_(self, key: str, default: str | None = None,
             choices: tuple[str, ...] | None = None) -> str | None:
        value = self.body.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise type_error(self.name(key), "a string", value)
        if choices is not None and value not in choices:
            raise range_error(self.name(key), f"in {', '.join(choices)}", value)
        return value

    def obj(self, key: str) -> Fields | None:
        value = self.body.get(key)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise type_error(self.name(key), "an object", value)
        return Fields(value, self.name(key) + ".")

    def int_list(self, key: str, minimum: int = 0) -> tuple[int, ...]:
        value = self.body.get(key)
        if value is None:
            return ()
        if not isinstance(value, list) or not all(is_int(v) for v in value):
            raise type_error(self.name(key), "an array of integers", value)
        if any(v < minimum for v in value):
            raise range_error(self.name(key), f">= {minimum} for every item", value)
        return tuple(value)

    def stop(self, key: str = "stop") -> tuple[str, ...]:
        """OpenAI `stop`: a string or an array of strings; empty strings are dropped."""
        value = self.body.get(key)
        if value is None:
            return ()
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
            raise type_error(self.name(key), "a string or an array of strings", value)
        return tuple(dict.fromkeys(s for s in items if s))

    def reject_unsupported(self, rules: Mapping[str, Callable[[Any], bool]]) -> None:
        """400 for a field present with a value this server cannot honour.

        `rules[key](value)` is True when the value is harmless (absent, null, default).
        """
        for key, harmless in rules.items():
            if key in self.body and self.body[key] is not None and not harmless(self.body[key]):
                raise unsupported(self.name(key), f"got {clip(self.body[key])}")

    def _check_range(self, key: str, value: float, minimum: float | None,
                     maximum: float | None) -> None:
        if minimum is not None and value < minimum:
            raise range_error(self.name(key), f">= {minimum}", value)
        if maximum is not None and value > maximum:
            raise range_error(self.name(key), f"<= {maximum}", value)
