"""The plain field predicates (rqsys.fieldcheck) never call valid what the
JSON Schema validator refuses, on every simple field of the request and
message schemas, and they do make the common fields plain."""

from __future__ import annotations

from typing import Any

import jsonschema

from rqsys import config
from rqsys.daemon import observe, schema
from rqsys.fieldcheck import predicate

VALUES: list[Any] = [None, True, False, 0, 1, -1, 1.0, 2.5, -0.5, 1e300, float("nan"), "",
                     "x", "que", "prep", "pause", "20261124.0051.34.279.0", "a.txt", "../a",
                     "0" * 32, "ab" * 1100, "http://h/x", "ftp://h", "99%", "12K", "tag:1",
                     "é", [], ["x"], ["http://h/x"], [1], ["a"] * 70, {}, {"k": 1},
                     100000, 100001, 31536000, 31536001, 2 ** 70]


def fields() -> list[dict[str, Any]]:
    subs = [sub for ops in (schema.OPS, observe.SCHEMAS) for s in ops.values()
            for sub in s["properties"].values()]
    return subs + list(config.schema("message")["properties"].values())


def test_a_predicate_never_says_valid_to_what_the_validator_refuses() -> None:
    # Given every field schema of the requests and of message.json
    made = 0
    for sub in fields():
        test = predicate(sub)
        if test is None:
            continue
        made += 1
        full = jsonschema.Draft202012Validator(sub)
        # When each value is asked both ways, Then "valid" is said only when it is
        for value in VALUES:
            if test(value):
                assert full.is_valid(value), (sub, value)
            elif full.is_valid(value):  # left to the validator: 1.0 as an integer, NaN
                assert isinstance(value, float), (sub, value)
    assert made >= 20  # the common fields are plain


def test_what_it_cannot_make_plain_is_left_to_the_validator() -> None:
    for sub in ({"not": {"pattern": "x"}}, {"type": ["string", "null"]},
                {"type": "array", "uniqueItems": True}, {"enum": [1, "a"]},
                {"type": "string", "minimum": 3}, {"type": "object"}):
        assert predicate(sub) is None, sub
    assert predicate({"title": "only a name", "type": "string"}) is not None
