"""The plain field predicates (rqsys.flatcheck) never call valid what the
JSON Schema validator refuses, on every simple field of the request and
message schemas, and they do make the common fields plain."""

from __future__ import annotations

from typing import Any

import jsonschema

from rqsys import config
from rqsys.daemon import observe
from rqsys.flatcheck import ANNOTATIONS, predicate
from rqsys.wire import schema

VALUES: list[Any] = [None, True, False, 0, 1, -1, 1.0, 2.5, -0.5, 1e300, float("nan"), "",
                     "x", "que", "prep", "pause", "20261124.0051.34.279.0", "a.txt", "../a",
                     "0" * 32, "ab" * 1100, "http://h/x", "ftp://h", "99%", "12K", "tag:1",
                     "é", [], ["x"], ["http://h/x"], [1], ["a"] * 70, {}, {"k": 1},
                     100000, 100001, 31536000, 31536001, 2 ** 70,
                     ["a", "a"], ["a", "b"], [1, 1], [1, 2], "3333", 3333, 70000, "a..b",
                     {"dest": "q"}, {"dest": "q", "param1": "x"}, {"dest": 1}, {"x": 1},
                     [{"name": "a"}], [{"name": "a..b"}], {"realm": "R", "users": {}},
                     {"memory_max": "1G"}, {"memory_max": 5}]


PLAIN = ("message", "config", "timer")  # every field of these gets a plain predicate


def fields() -> list[dict[str, Any]]:
    subs = [sub for ops in (schema.OPS, observe.SCHEMAS) for s in ops.values()
            for sub in s["properties"].values()]
    return subs + [sub for name in PLAIN for sub in config.schema(name)["properties"].values()]


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


def test_every_field_of_a_message_config_and_timer_is_plain() -> None:
    # Given the schemas read on every create, every web, scan and supervisor
    # start and every timer firing: a field left to jsonschema imports it (70 ms)
    for name in PLAIN:
        for field, sub in config.schema(name)["properties"].items():
            # Then each has a plain predicate (or names the field only)
            assert set(sub) <= ANNOTATIONS or predicate(sub) is not None, (name, field)


def test_what_it_cannot_make_plain_is_left_to_the_validator() -> None:
    for sub in ({"not": {"pattern": "x"}}, {"type": ["string", "null"]},
                {"type": "array", "uniqueItems": True}, {"enum": [1, "a"]},
                {"type": "string", "minimum": 3}, {"type": "object"}):
        assert predicate(sub) is None, sub
    assert predicate({"title": "only a name", "type": "string"}) is not None
