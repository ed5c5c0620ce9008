"""Exact plain-Python checks of the JSON Schemas rqsys writes itself: a
compiled check says True exactly when jsonschema (draft 2020-12) would.

Importing jsonschema costs a daemon some 70 ms and 7 MiB at every start,
only to hear that its queue config is valid.  :func:`compile_schema` turns a
schema made of the keywords below into nested closures; any other keyword
(``patternProperties``, ``if``, a remote ``$ref``, ...) makes it return
None and the caller keeps jsonschema.  A value holding anything but JSON's
own types (a tuple, a NaN, a non-string key) raises :class:`Undecided`, so
the caller asks jsonschema about it too.  The check is exact rather than
merely safe because ``not`` turns a "no" into a "yes"; the error a user
reads always comes from jsonschema (the caller asks it on anything but
True), so errors are the same as before.  ``format`` is an annotation, as
with jsonschema's default validators (no format checker).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

Check = Callable[[Any], bool]
DRAFT = "https://json-schema.org/draft/2020-12/schema"
ANNOTATIONS = frozenset({"$schema", "$comment", "$defs", "title", "description", "default",
                         "examples", "format", "deprecated", "readOnly", "writeOnly"})


class Undecided(Exception):
    """A value this module cannot judge exactly: ask jsonschema."""


class Unsupported(Exception):
    """A schema keyword this module does not compile."""


def _is_integer(value: Any) -> bool:
    # draft 6 on: 1.0 is an integer; a bool never is (bool subclasses int)
    return (type(value) is int) or (type(value) is float and value.is_integer())


TYPES: dict[str, Check] = {
    "string": lambda v: type(v) is str, "integer": _is_integer,
    "number": lambda v: type(v) in (int, float), "boolean": lambda v: type(v) is bool,
    "null": lambda v: v is None, "array": lambda v: type(v) is list,
    "object": lambda v: type(v) is dict}
PLAIN = (str, int, float, bool, type(None))


def compile_schema(schema: Any) -> Check | None:
    """A check of ``schema`` (True iff valid; Undecided for odd values), or
    None when ``schema`` uses anything this module does not compile."""
    if isinstance(schema, dict) and schema.get("$schema", DRAFT) != DRAFT:
        return None
    try:
        inner = _Compiler(schema).node(schema)
    except Unsupported:
        return None

    def check(value: Any) -> bool:
        _plain(value)
        return inner(value)

    return check


def _plain(value: Any) -> None:
    """Undecided unless ``value`` is made only of JSON's types."""
    kind = type(value)
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str:
                raise Undecided(key)
            _plain(item)
    elif kind is list:
        for item in value:
            _plain(item)
    elif kind not in PLAIN or (kind is float and not math.isfinite(value)):
        raise Undecided(value)


def _all(checks: list[Check]) -> Check:
    if not checks:
        return lambda _v: True
    if len(checks) == 1:
        return checks[0]
    return lambda v: all(check(v) for check in checks)


def _only(kind: str, test: Check) -> Check:
    """``test`` for values of JSON type ``kind``; any other value passes (as
    in JSON Schema, where ``minimum`` says nothing of a string)."""
    is_kind = TYPES[kind]
    return lambda v: not is_kind(v) or test(v)


def _key(value: Any) -> tuple[str, Any] | None:
    """What JSON Schema's equality compares (1 == 1.0, True != 1); None for
    a list or object."""
    if type(value) is bool or value is None:
        return ("b", value)
    if type(value) in (int, float):
        return ("n", value)
    if type(value) is str:
        return ("s", value)
    return None


def _unique(items: list[Any]) -> bool:
    keys = [_key(item) for item in items]
    if any(key is None for key in keys):
        raise Undecided(items)  # nested lists and objects: jsonschema's own equality
    return len(set(keys)) == len(keys)


def _enum(choices: Any) -> Check:
    if not isinstance(choices, list) or any(_key(c) is None for c in choices):
        raise Unsupported("enum")
    allowed = frozenset(_key(c) for c in choices)
    return lambda v: _key(v) in allowed


BOUNDS: dict[str, tuple[str, Callable[[Any, Any], bool]]] = {
    "minimum": ("number", lambda v, b: v >= b), "maximum": ("number", lambda v, b: v <= b),
    "exclusiveMinimum": ("number", lambda v, b: v > b),
    "exclusiveMaximum": ("number", lambda v, b: v < b),
    "minLength": ("string", lambda v, b: len(v) >= b),
    "maxLength": ("string", lambda v, b: len(v) <= b),
    "minItems": ("array", lambda v, b: len(v) >= b),
    "maxItems": ("array", lambda v, b: len(v) <= b)}


class _Compiler:
    """Compiles one schema document (its ``$defs`` are what ``$ref`` names)."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self.refs: dict[str, list[Check]] = {}  # filled once compiled (a cycle waits)

    def node(self, schema: Any) -> Check:
        if schema is True or schema is False:
            answer: bool = schema
            return lambda _v: answer
        if not isinstance(schema, dict):
            raise Unsupported(schema)
        # the root's $id names the document; a nested one would move what $ref means
        skip = ANNOTATIONS | {"$id"} if schema is self.root else ANNOTATIONS
        return _all([self.keyword(key, value, schema)
                     for key, value in schema.items() if key not in skip])

    def keyword(self, key: str, value: Any, schema: dict[str, Any]) -> Check:
        if key in BOUNDS:
            kind, test = BOUNDS[key]
            if type(value) not in (int, float):
                raise Unsupported(key)
            return _only(kind, lambda v: test(v, value))
        simple = {"type": self.type, "enum": _enum, "const": lambda c: _enum([c]),
                  "pattern": self.pattern, "$ref": self.ref, "not": self.not_,
                  "allOf": self.all_of, "anyOf": self.any_of, "items": self.items,
                  "uniqueItems": self.unique, "required": self.required,
                  "propertyNames": self.names, "dependentRequired": self.depends}
        if key in simple:
            return simple[key](value)  # type: ignore[no-any-return, operator]
        if key in ("properties", "additionalProperties"):
            return self.properties(schema) if key == "properties" else self.extra(schema)
        raise Unsupported(key)

    def type(self, kinds: Any) -> Check:
        names = [kinds] if isinstance(kinds, str) else kinds
        if not isinstance(names, list) or not all(n in TYPES for n in names):
            raise Unsupported("type")
        tests = [TYPES[n] for n in names]
        return tests[0] if len(tests) == 1 else lambda v: any(t(v) for t in tests)

    def pattern(self, text: Any) -> Check:
        if not isinstance(text, str):
            raise Unsupported("pattern")
        search = re.compile(text).search
        return _only("string", lambda v: search(v) is not None)

    def ref(self, target: Any) -> Check:
        if not isinstance(target, str) or not target.startswith("#/$defs/") \
                or "/" in target[8:] or "~" in target:
            raise Unsupported(target)
        if target not in self.refs:
            cell: list[Check] = []
            self.refs[target] = cell
            defs = self.root.get("$defs", {}) if isinstance(self.root, dict) else {}
            if target[8:] not in defs:
                raise Unsupported(target)
            cell.append(self.node(defs[target[8:]]))
        cell = self.refs[target]
        return lambda v: cell[0](v)

    def not_(self, sub: Any) -> Check:
        inner = self.node(sub)
        return lambda v: not inner(v)

    def all_of(self, subs: Any) -> Check:
        return _all([self.node(sub) for sub in self._list(subs)])

    def any_of(self, subs: Any) -> Check:
        checks = [self.node(sub) for sub in self._list(subs)]
        return lambda v: any(check(v) for check in checks)

    @staticmethod
    def _list(subs: Any) -> list[Any]:
        if not isinstance(subs, list) or not subs:
            raise Unsupported(subs)
        return subs

    def items(self, sub: Any) -> Check:
        inner = self.node(sub)
        return _only("array", lambda v: all(inner(item) for item in v))

    @staticmethod
    def unique(flag: Any) -> Check:
        if flag is not True and flag is not False:
            raise Unsupported("uniqueItems")
        return _only("array", _unique) if flag else (lambda _v: True)

    @staticmethod
    def required(names: Any) -> Check:
        if not isinstance(names, list) or not all(type(n) is str for n in names):
            raise Unsupported("required")
        return _only("object", lambda v: all(n in v for n in names))

    def names(self, sub: Any) -> Check:
        inner = self.node(sub)
        return _only("object", lambda v: all(inner(key) for key in v))

    @staticmethod
    def depends(table: Any) -> Check:
        if not isinstance(table, dict) or not all(isinstance(n, list) for n in table.values()):
            raise Unsupported("dependentRequired")
        return _only("object", lambda v: all(all(n in v for n in needs)
                                             for key, needs in table.items() if key in v))

    def properties(self, schema: dict[str, Any]) -> Check:
        props = schema["properties"]
        if not isinstance(props, dict):
            raise Unsupported("properties")
        checks = {name: self.node(sub) for name, sub in props.items()}
        return _only("object", lambda v: all(checks[k](item) for k, item in v.items()
                                             if k in checks))

    def extra(self, schema: dict[str, Any]) -> Check:
        """``additionalProperties``: the names ``properties`` does not list."""
        if "patternProperties" in schema:
            raise Unsupported("patternProperties")
        known = frozenset(schema.get("properties") or ())
        inner = self.node(schema["additionalProperties"])
        return _only("object", lambda v: all(inner(item) for k, item in v.items()
                                             if k not in known))
