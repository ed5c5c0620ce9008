"""Plain Python predicates for simple field schemas (a type and its bounds),
made once from the schema: the per-field half of ``flatcheck``'s fast "valid".

jsonschema's ``is_valid`` of even ``{"type": "string"}`` walks its generic
machinery (a few microseconds a field, several fields a create).  A field
schema made only of the keywords below becomes one small closure instead;
any other keyword (``not``, ``anyOf``, ``uniqueItems``, a list of types,
...) makes :func:`predicate` return None, and the caller keeps jsonschema's
validator for that field.  A predicate may say False to a valid value (an
integer sent as ``1.0``, a boolean in a mixed enum): the caller then asks
the full validator; it never says True to an invalid one.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

Predicate = Callable[[Any], bool]
ANNOTATIONS = frozenset({"$comment", "title", "description", "default", "examples"})
TYPES: dict[str, tuple[type, ...]] = {"string": (str,), "integer": (int,),
                                      "number": (int, float), "boolean": (bool,),
                                      "array": (list,)}
BOUNDS = {"minimum": lambda b: lambda v: v >= b, "maximum": lambda b: lambda v: v <= b,
          "exclusiveMinimum": lambda b: lambda v: v > b,
          "exclusiveMaximum": lambda b: lambda v: v < b,
          "minLength": lambda b: lambda v: len(v) >= b,
          "maxLength": lambda b: lambda v: len(v) <= b,
          "minItems": lambda b: lambda v: len(v) >= b,
          "maxItems": lambda b: lambda v: len(v) <= b}
# which bounds apply to which type (a bound of another type is ignored by the
# schema, so a field mixing them is left to jsonschema)
APPLIES = {"string": {"minLength", "maxLength", "pattern"},
           "integer": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"},
           "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"},
           "boolean": set(), "array": {"minItems", "maxItems", "items"}}


def predicate(sub: dict[str, Any]) -> Predicate | None:
    """A closure saying True only of values ``sub`` accepts; None when ``sub``
    uses anything this module does not make plain."""
    keys = set(sub) - ANNOTATIONS
    if keys == {"enum"}:
        return _enum(sub["enum"])
    kind = sub.get("type")
    if not isinstance(kind, str) or kind not in TYPES or not keys - {"type"} <= APPLIES[kind]:
        return None
    checks = [_bound(key, sub[key]) for key in sorted(keys - {"type", "items"})]
    if "items" in keys:
        item = predicate(sub["items"]) if isinstance(sub["items"], dict) else None
        if item is None:
            return None
        checks.append(lambda v: all(item(x) for x in v))
    return _all_of(TYPES[kind], checks)


def _all_of(types: tuple[type, ...], checks: list[Predicate | None]) -> Predicate | None:
    if any(check is None for check in checks):
        return None
    tests = [check for check in checks if check is not None]

    def valid(value: Any) -> bool:
        # type(), not isinstance(): a bool is no integer here, a str subclass no string
        return type(value) in types and all(test(value) for test in tests)

    return valid


def _bound(key: str, limit: Any) -> Predicate | None:
    if key == "pattern":
        return re.compile(limit).search if isinstance(limit, str) else None  # type: ignore[return-value]
    if type(limit) not in (int, float):
        return None
    return BOUNDS[key](limit)  # type: ignore[no-untyped-call]


def _enum(choices: Any) -> Predicate | None:
    """An enum of strings only (1 == True == 1.0 in Python, not in JSON Schema)."""
    if not isinstance(choices, list) or not all(type(c) is str for c in choices):
        return None
    allowed = frozenset(choices)
    return lambda value: type(value) is str and value in allowed
