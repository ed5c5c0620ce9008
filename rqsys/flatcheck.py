"""A fast "valid" for flat JSON Schemas: an object of known fields, each checked
by a validator of its own field schema.

jsonschema walks a whole object through its generic machinery (some thirty
microseconds for a small socket request or message, on every create); most
fields of a request are few and simple.  :class:`FlatCheck` checks the
object's shape itself (its type, which names are allowed, ``required``,
``dependentRequired``) and each present field with a validator of that
field's schema (a plain closure from ``rqsys.fieldcheck`` where the field's
schema is simple, else its own jsonschema validator, made the first time
such a field is present: most requests carry none, and importing jsonschema
is some 70 ms and 7 MiB), skipping a field whose schema only names it.  Only its
"valid" is trusted: on anything else the caller asks the full validator,
whose error names the field.  A schema that is not flat (references,
combinators at the top) gets no FlatCheck.
"""

from __future__ import annotations

from typing import Any

from rqsys.fieldcheck import Predicate, predicate

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
