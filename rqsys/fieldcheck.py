"""Plain Python predicates for simple field schemas (a type or a list of
types, their bounds, items, a flat object's fields), made once from the
schema: the per-field half of ``flatcheck``'s fast "valid".

jsonschema's ``is_valid`` of even ``{"type": "string"}`` walks its generic
machinery (a few microseconds a field, several fields a create), and
importing it costs some 70 ms and 7 MiB.  A field schema made only of the
keywords below becomes one small closure instead: ``uniqueItems`` of
strings or integers, ``not`` of a string pattern, an object that is itself
flat (``rqsys.flatcheck``).  Any other keyword (``anyOf``, a reference, ...)
makes :func:`predicate` return None, and the caller keeps jsonschema's
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
           "boolean": set(), "array": {"minItems", "maxItems", "items", "uniqueItems"}}
HASHABLE = frozenset({"string", "integer"})  # items a set compares as JSON does


def predicate(sub: dict[str, Any]) -> Predicate | None:
    """A closure saying True only of values ``sub`` accepts; None when ``sub``
    uses anything this module does not make plain."""
    keys = set(sub) - ANNOTATIONS
    if keys == {"enum"}:
        return _enum(sub["enum"])
    kind = sub.get("type")
    if kind == "object":
        from rqsys.flatcheck import FlatCheck  # a flat object is checked as the top one

        return FlatCheck(sub).passes if FlatCheck.fits(sub) else None
    if isinstance(kind, list):
        return _any_type(sub, keys, kind)
    if kind not in TYPES or not keys - {"type", "not"} <= APPLIES[kind]:
        return None
    checks = [_bound(key, sub[key]) for key in sorted(keys - {"type", "items", "uniqueItems",
                                                               "not"})]
    if "not" in keys:
        checks.append(_not_pattern(kind, sub["not"]))
    if "items" in keys or "uniqueItems" in keys:
        checks.append(_items(sub))
    return _all_of(TYPES[kind], checks)


def _any_type(sub: dict[str, Any], keys: set[str], kinds: list[Any]) -> Predicate | None:
    """``"type": [...]``: each value is checked by the keywords of its own type
    (a bound of another type does not apply to it)."""
    if not kinds or not all(isinstance(k, str) and k in TYPES for k in kinds):
        return None
    if not keys - {"type"} <= set().union(*(APPLIES[k] for k in kinds)):
        return None
    made = [predicate({k: v for k, v in sub.items() if k in APPLIES[kind]} | {"type": kind})
            for kind in kinds]
    eaches = [each for each in made if each is not None]
    if len(eaches) < len(made):
        return None
    return lambda value: any(each(value) for each in eaches)


def _items(sub: dict[str, Any]) -> Predicate | None:
    """An array's ``items`` (each by its predicate) and ``uniqueItems`` (of
    strings or integers only, which a set compares as JSON does)."""
    items = sub.get("items")
    item = predicate(items) if isinstance(items, dict) else None
    if "items" in sub and item is None:
        return None
    unique = sub.get("uniqueItems", False)
    if unique is not False and (unique is not True or not isinstance(items, dict)
                                or items.get("type") not in HASHABLE):
        return None
    each: Predicate = item or (lambda _x: True)
    if unique:
        return lambda v: all(each(x) for x in v) and len(set(v)) == len(v)
    return lambda v: all(each(x) for x in v)


def _not_pattern(kind: str, sub: Any) -> Predicate | None:
    """``not`` of a string pattern alone (an attachment name's ``..``)."""
    if kind != "string" or not isinstance(sub, dict) or set(sub) - ANNOTATIONS != {"pattern"}:
        return None
    found = re.compile(sub["pattern"]).search
    return lambda v: not found(v)


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
