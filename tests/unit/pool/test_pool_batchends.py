"""Unit tests of a pool batch member's end: what is carried, and under which key."""

from __future__ import annotations

import json

from rqsys.pool import batchends


def test_an_end_names_its_batch_and_how_it_ended() -> None:
    msg = {"dest": "bp", "batch": "b20261128.101500.0123abcd"}
    assert batchends.end_of(msg, "done") == ("b20261128.101500.0123abcd", "done")
    assert batchends.end_of(msg, "err") == ("b20261128.101500.0123abcd", "err")
    assert batchends.end_of(msg, "") == ("b20261128.101500.0123abcd", "gone")  # deleted


def test_a_message_of_no_batch_carries_nothing() -> None:
    assert batchends.end_of({"dest": "bp"}, "done") is None
    assert batchends.end_of({"dest": "bp", "batch": ""}, "done") is None
    assert batchends.end_of({"dest": "bp", "batch": 7}, "done") is None
    assert batchends.end_of(None, "done") is None
    assert batchends.end_of("not a message", "done") is None


def test_a_delivery_is_read_only_when_it_may_name_a_batch() -> None:
    assert batchends.msg_in(json.dumps({"dest": "bp"}).encode()) is None
    data = json.dumps({"dest": "bp", "batch": "b20261128.101500.0123abcd"}).encode()
    assert batchends.msg_in(data) == {"dest": "bp", "batch": "b20261128.101500.0123abcd"}


def test_the_key_names_the_host_that_made_the_id() -> None:
    # a pool id ends in n * 100 + host: host 7 made this one (its 5th id that ms)
    assert batchends.key("20261128.1015.01.123.507") == "bend.7.20261128.1015.01.123.507"
    assert batchends.key("20261128.1015.01.123.99") == "bend.99.20261128.1015.01.123.99"
