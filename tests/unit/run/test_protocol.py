"""Unit tests of the queue-script pipe grammar."""

import pytest

from rqsys.errors import ProtocolError
from rqsys.run.protocol import MAX_TEXT, Command, parse_line, progress


@pytest.mark.parametrize(("raw", "expected"), [
    (b"run half way", Command("run", "half way")),
    (b"done", Command("done", "")),
    (b"done all fine\r", Command("done", "all fine")),
    (b"err disk full", Command("err", "disk full")),
    (b"relayed http://h/q/a/1", Command("relayed", "http://h/q/a/1")),
    (b"resend 30-busy", Command("resend", "busy", due=30)),
    (b"resend 0-", Command("resend", "", due=0)),
    (b"dup 0-x-other", Command("dup", "0-x-other", due=0, dest="other")),
    (b"dup 5-x-http://h:3333/q/b/", Command("dup", "5-x-http://h:3333/q/b/", due=5,
                                            dest="http://h:3333/q/b/")),
])
def test_parses(raw, expected):
    assert parse_line(raw) == expected


@pytest.mark.parametrize(("raw", "words"), [
    (b"", "unknown command"), (b"finish now", "unknown command"),
    (b"DONE upper", "unknown command"), (b"relayed", "needs the new message URL"),
    (b"resend soon-x", "bad delay"), (b"resend -5-x", "bad delay"),
    (b"dup 0-x", "DUE-X-DEST"), (b"dup x-x-q", "bad delay"), (b"dup 0-x- ", "DUE-X-DEST"),
])
def test_rejects(raw, words):
    with pytest.raises(ProtocolError, match=words):
        parse_line(raw)


def test_terminal_commands():
    assert [parse_line(r).terminal for r in (b"run x", b"done", b"err", b"resend 1-x")] == \
        [False, True, True, True]


def test_long_text_is_cut_but_the_command_counts():
    cmd = parse_line(b"done " + b"y" * (MAX_TEXT * 3))
    assert cmd.kind == "done" and len(cmd.text) == MAX_TEXT


def test_invalid_utf8_is_replaced():
    assert parse_line(b"run caf\xe9").text == "caf\ufffd"


@pytest.mark.parametrize(("text", "expected"), [
    ("45% rows", {"fraction": 0.45}),
    ("1.5 % warming", {"fraction": 0.015}),
    ("3/10 files", {"fraction": 0.3, "done": 3, "total": 10}),
    ("  7 / 8", {"fraction": 0.875, "done": 7, "total": 8}),
    ("100%", {"fraction": 1.0}),
    # not progress: nonsense or not at the start
    ("101%", None), ("3/0", None), ("5/3", None), ("12.5/100", None), ("loading 5%", None),
    ("", None), ("-5%", None),
])
def test_progress_of_a_run_text(text, expected):
    assert progress(text) == expected
