"""The whole-message size limit holds on a flat message, whose check no longer
encodes it when it is surely small (rqsys.message._surely_small): a message
made only of strings that JSON escapes (6 or 12 bytes a character) is still
refused, and the bound never calls small what is over the limit."""

from __future__ import annotations

import json

import pytest

from rqsys import message as limits
from rqsys.errors import TooLarge

CHARS = ["a", "\u0001", "\U0001f600", "é"]


@pytest.mark.parametrize("char", CHARS[1:3])
def test_a_flat_message_of_escaped_text_over_1_mib_is_refused(char):
    # Given four params each under their own limit (100 KiB as UTF-8)
    per = limits.PARAM_MAX // len(char.encode())
    msg = {f"param{n}": char * per for n in range(1, 5)}
    # When checked, Then JSON's escapes put the message over 1 MiB, and it is refused
    assert len(json.dumps(msg)) > limits.MESSAGE_MAX
    with pytest.raises(TooLarge, match=r"message too large: \d+ bytes as JSON"):
        limits.check_message(msg)


def test_the_bound_never_calls_small_what_is_over_the_limit():
    for char in CHARS:
        for size in (10, 1000, 20_000, 90_000, 100_000):
            msg = {"dest": "q", "count": 10 ** 17, "due": 1.5, "force_remote": True,
                   **{f"param{n}": char * size for n in range(1, 5)}}
            if limits._surely_small(msg):
                assert len(json.dumps(msg).encode()) < limits.MESSAGE_MAX, (char, size)
    assert limits._surely_small({"param1": "x", "count": 0})
    assert not limits._surely_small({"tags": ["a"]})  # not flat: encoded to be sure
