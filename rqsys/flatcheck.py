"""A fast "valid" for flat JSON Schemas: an object of known fields, each checked
by a validator of its own field schema.

jsonschema walks a whole object through its generic machinery (some thirty
microseconds for a small socket request or message, on every create); most
fields of a request are few and simple.  :class:`FlatCheck` checks the
object's shape itself (its type, which names are allowed, ``required``,
``dependentRequired``) and each present field with a validator of that
field's schema (a plain closure, :func:`predicate` below, where the field's
schema is simple, else its own jsonschema validator, made the first time
such a field is present: most requests carry none, and importing jsonschema
is some 70 ms and 7 MiB), skipping a field whose schema only names it.  Only its
"valid" is trusted: on anything else the caller asks the full validator,
whose error names the field.  A schema that is not flat (references,
combinators at the top) gets no FlatCheck.

The field predicates: jsonschema's ``is_valid`` of even ``{"type": "string"}`` walks its generic
machinery (a few microseconds a field, several fields a create), and
importing it costs some 70 ms and 7 MiB.  A field schema made only of the
keywords below becomes one small closure instead: ``uniqueItems`` of
strings or integers, ``not`` of a string pattern, an object that is itself
flat (a :class:`FlatCheck` of its own).  Any other keyword (``anyOf``, a reference, ...)
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
FIELD_ANNOTATIONS = frozenset({"$comment", "title", "description", "default", "examples"})
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
    keys = set(sub) - FIELD_ANNOTATIONS
    if keys == {"enum"}:
        return _enum(sub["enum"])
    kind = sub.get("type")
    if kind == "object":

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
    if kind != "string" or not isinstance(sub, dict) or set(sub) - FIELD_ANNOTATIONS != {"pattern"}:
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


ANNOTATIONS = frozenset({"$schema", "$id", "$comment", "title", "description"})
SHAPE = frozenset({"type", "properties", "required", "additionalProperties",
                   "dependentRequired"})


class FlatCheck:
    """The fast path of one flat object schema."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.required = frozenset(schema.get("required", ()))
        self.depends = {k: frozenset(v) for k, v in schema.get("dependentRequired", {}).items()}
        self.fields: dict[str, Predicate | None] = {
            name: None if set(sub) <= ANNOTATIONS else predicate(sub) or _field(schema, sub)
            for name, sub in schema["properties"].items()}

    @staticmethod
    def fits(schema: dict[str, Any]) -> bool:
        """Whether ``schema`` is flat: an object of known properties, nothing
        else allowed, no reference anywhere in it."""
        props = schema.get("properties")
        return (set(schema) - ANNOTATIONS <= SHAPE and schema.get("type") == "object"
                and schema.get("additionalProperties") is False and isinstance(props, dict)
                and all(isinstance(sub, dict) and not _refers(sub) for sub in props.values()))

    def passes(self, data: Any) -> bool:
        """True only when ``data`` is valid (False: let the full validator say why)."""
        if not isinstance(data, dict) or not self.required <= data.keys():
            return False
        for name, value in data.items():
            if name not in self.fields:
                return False
            needs = self.depends.get(name)
            if needs is not None and not needs <= data.keys():
                return False
            field = self.fields[name]
            if field is not None and not field(value):
                return False
        return True


def _field(schema: dict[str, Any], sub: dict[str, Any]) -> Predicate:
    """A field's jsonschema check (of the draft ``schema`` names), compiled
    the first time a value of that field is checked."""
    compiled: list[Predicate] = []

    def check(value: Any) -> bool:
        if not compiled:
            import jsonschema  # here: only a request with such a field needs it

            compiled.append(jsonschema.validators.validator_for(schema)(sub).is_valid)
        return compiled[0](value)
    return check


def flat_check(schema: dict[str, Any]) -> FlatCheck | None:
    """A FlatCheck for ``schema``, or None when it is not flat."""
    return FlatCheck(schema) if FlatCheck.fits(schema) else None


def _refers(node: Any) -> bool:
    """Whether a schema uses a ``$`` keyword (``$ref``, ``$defs``, ...) anywhere:
    a field's schema is then not checked on its own."""
    if isinstance(node, dict):
        return any(key.startswith("$") or _refers(value) for key, value in node.items())
    if isinstance(node, list):
        return any(_refers(item) for item in node)
    return False
