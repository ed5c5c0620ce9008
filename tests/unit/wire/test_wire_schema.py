"""The fast path of the request check (FlatCheck) agrees with the full
JSON Schema validator on every op: it says "valid" exactly when the validator
does, and a refusal still names the field."""

from __future__ import annotations

import itertools
from typing import Any

import jsonschema
import pytest

from rqsys import config
from rqsys.daemon import observe
from rqsys.errors import BadRequest
from rqsys.flatcheck import FlatCheck
from rqsys.wire import schema

ALL = {**schema.OPS, **observe.SCHEMAS}
# values of every JSON type, and ones that fit the fields' patterns and enums
VALUES: list[Any] = [None, True, 0, 7, -1, 2.5, "", "x", "que", "prep", "done", "pause",
                     "20261124.0051.34.279.0", "a.txt", "../a", "0" * 32, "ab" * 200,
                     "0123456789ab", "retry", [], [{"name": "a.txt", "md5": "0" * 32}],
                     [{"name": "a"}], {}, {"param1": "x"}]


def requests(op: str, props: dict[str, Any]) -> list[dict[str, Any]]:
    """The op alone, each field with each value, pairs of fields, and an unknown field."""
    names = list(props)
    out = [{"op": op}, {"op": op, "unknown": 1}, {"op": 5}]
    for name, value in itertools.product(names, VALUES):
        out.append({"op": op, name: value})
    for (a, b), value in itertools.product(itertools.combinations(names, 2), VALUES[:12]):
        out.append({"op": op, a: value, b: VALUES[(VALUES.index(value) + 3) % len(VALUES)]})
    return out


@pytest.mark.parametrize("op", sorted(ALL))
def test_the_fast_path_says_valid_exactly_when_the_schema_does(op: str) -> None:
    # Given an op's schema, flat as request() makes them
    full = jsonschema.validators.validator_for(ALL[op])(ALL[op])
    flat = FlatCheck(ALL[op])
    assert FlatCheck.fits(ALL[op])
    # When requests of every shape are checked both ways, Then they agree
    for args in requests(op, ALL[op]["properties"]):
        assert flat.passes(args) == full.is_valid(args), args


def test_a_refusal_still_names_the_field() -> None:
    checker = schema.Checker(schema.OPS)
    checker.check("create", {"op": "create", "msg": {"param1": "x"}, "by": "http ::1"})
    with pytest.raises(BadRequest, match="invalid creator \\(by\\)"):
        checker.check("create", {"op": "create", "msg": {}, "by": "x" * 300})
    with pytest.raises(BadRequest, match="unknown state for a new message 'run'"):
        checker.check("create", {"op": "create", "state": "run"})
    with pytest.raises(BadRequest, match="create: \\(top level\\)"):
        checker.check("create", {"op": "create", "nonsense": 1})


def test_a_schema_that_is_not_flat_takes_the_full_validator_only() -> None:
    # Given an extra op whose schema refers elsewhere ($ref), as a test build may add
    odd = {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
           "$defs": {"n": {"type": "integer"}},
           "properties": {"op": {"type": "string"}, "n": {"$ref": "#/$defs/n"}},
           "required": ["op"], "additionalProperties": False}
    checker = schema.Checker({**schema.OPS, "odd": odd})
    # Then no fast path is made for it, and its check still works
    assert not FlatCheck.fits(odd)
    checker.check("odd", {"op": "odd", "n": 3})
    with pytest.raises(BadRequest, match="n"):
        checker.check("odd", {"op": "odd", "n": "three"})


MESSAGES: list[Any] = [
    {}, {"param1": "x"}, {"param1": 5}, {"dest": "q", "param2": "y", "max_count": 3},
    {"max_count": "3"}, {"due": 1.5}, {"due": "soon"}, {"unique_for": 5},
    {"unique_key": "k", "unique_for": 5}, {"after_policy": "wait"}, {"tags": ["a", "b"]},
    {"tags": "a"}, {"priority": 2}, {"priority": 2.5}, {"timeout": 0}, {"timeout": -1},
    {"nonsense": 1}, {"force_remote": True}, {"force_remote": "yes"}, {"relay_via": []},
    {"post_run_webhook": ["http://h/x"]}, {"limits": {}}, {"limits": 5}, [], "x", None]


def test_the_message_schema_takes_the_fast_path_with_the_same_verdicts() -> None:
    # Given message.json, which a create validates
    message = config.schema("message")
    assert FlatCheck.fits(message)
    flat, full = FlatCheck(message), jsonschema.validators.validator_for(message)(message)
    # Then every message, valid or not, gets the validator's verdict
    for msg in MESSAGES:
        assert flat.passes(msg) == full.is_valid(msg), msg
    # and config.validate still names the field of a bad one
    with pytest.raises(Exception, match="max_count"):
        config.validate("message", {"max_count": "3"}, "message")


def test_every_op_schema_compiles() -> None:
    # Given the full validators compiled lazily (on a request the fast path does not pass)
    checker = schema.Checker(schema.OPS)
    # Then each op's schema is itself a valid JSON Schema, as at start before
    for op in schema.OPS:
        assert checker.validator(op).is_valid({"op": op}) == (not schema.OPS[op]["required"][1:])
