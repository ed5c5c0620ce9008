"""Queued messages read at start share one copy of their repeated strings
(rqsys.store.msgshare), and the fast parse answers what json.loads answers."""

from __future__ import annotations

import json

import pytest

from rqsys.store import msgshare


@pytest.mark.parametrize("whole", [
    b'{"dest": "q", "param1": "a"}', b' {"a": 1}\n', '{"é": "ü"}'.encode(),
    '{"a": 1}'.encode("utf-16"), b'\xef\xbb\xbf{"a": 1}', b"[1, 2]"])
def test_parse_gives_what_json_loads_gives(whole: bytes) -> None:
    assert msgshare.parse(whole) == json.loads(whole)


@pytest.mark.parametrize("whole", [b'{"a": 1} x', b'{"a": ', b"", b"\xff\xfe\xfd", b"{} {}"])
def test_parse_refuses_what_json_loads_refuses(whole: bytes) -> None:
    with pytest.raises(ValueError):
        json.loads(whole)
    with pytest.raises(ValueError):
        msgshare.parse(whole)


def test_messages_read_apart_share_their_field_names_queue_and_id() -> None:
    # Given two messages decoded by separate calls (each with its own key strings)
    ids = ["20261124.0700.00.000.1", "20261124.0700.00.000.2"]
    raw = [json.loads(json.dumps({"dest": "queue", "param1": "x", "msg_id": i})) for i in ids]
    # When each is shared
    one, two = (msgshare.shared(i, msg) for i, msg in zip(ids, raw, strict=True))
    # Then each equals what was read, and the repeated strings are one object each
    assert [one, two] == raw
    assert all(a is b for a, b in zip(one, two, strict=True)) and one["dest"] is two["dest"]
    assert one["msg_id"] is ids[0]
    # And an id that disagrees with the directory's name is kept as it was
    odd = msgshare.shared(ids[1], {"msg_id": ids[0]})
    assert odd == {"msg_id": ids[0]} and odd["msg_id"] is not ids[1]
