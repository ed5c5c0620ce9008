"""Unit tests of the console's filter language (``rqsys.search.filters``)."""

from __future__ import annotations

import pytest

from rqsys.errors import BadRequest
from rqsys.search import filters

NOW = 1_800_000_000.0


def test_every_key_and_free_words():
    got = filters.parse('state:err queue:etl-* tag:nightly param1:~2026-11 param2:db01 '
                        'priority:>5 since:1h until:2027-01-01 "ValueError" bad row', NOW)
    assert got.queues == ["etl-*"]
    assert got.args == {
        "state": "err", "tag": "nightly",
        "params": {"1": {"op": "has", "value": "2026-11"}, "2": {"op": "eq", "value": "db01"}},
        "priority": {"op": ">", "value": 5}, "since": NOW - 3600,
        "until": 1798761600.0, "text": "ValueError bad row"}
    assert got.takes("etl-nightly") and not got.takes("billing")


def test_queue_globs_are_any_of_them_and_none_is_all():
    assert filters.parse("queue:etl-* queue:billing").takes("billing")
    assert filters.parse("words only").takes("anything")


@pytest.mark.parametrize("text,value", [("priority:3", ("=", 3)), ("priority:<=-2", ("<=", -2)),
                                        ("priority:>=10", (">=", 10))])
def test_priority_comparisons(text, value):
    got = filters.parse(text).args["priority"]
    assert (got["op"], got["value"]) == value


def test_words_with_a_colon_that_are_not_keys_are_searched():
    # an exception's name, a time, a URL: words, not keys
    got = filters.parse("ValueError: 10:30 https://example.com/x")
    assert got.args == {"text": "ValueError: 10:30 https://example.com/x"}


@pytest.mark.parametrize("text,said", [
    ("stat:err", "no key 'stat'"), ("state:nope", "state must be one of"),
    ("priority:lots", "priority: say"), ("since:yesterdayish", "since: not a time"),
    ("tag:", "tag: says nothing"), ('"unclosed', "No closing quotation"),
    ("param1:" + "x" * 501, "at most 500")])
def test_what_is_wrong_is_named(text, said):
    with pytest.raises(BadRequest, match=said):
        filters.parse(text)


def test_completions_offer_keys_states_and_queues():
    offered = filters.completions(["etl", "billing"])
    assert "tag:" in offered and "param1:" in offered and "priority:" in offered
    assert "state:err" in offered and "queue:etl" in offered and "queue:billing" in offered
