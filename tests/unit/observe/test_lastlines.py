"""Unit tests of a failed run's last lines and the failure reason built on them."""

from __future__ import annotations

import os

import pytest

from rqsys.observe import lastlines
from rqsys.observe.failures import Groups, group_key, reason_of

IMPROPER = ("PROCESS EXITED IMPROPERLY - MOVING TO ERR - Completion was  but exit status "
            "was pid 4242 exit 1")


def test_the_last_lines_as_a_terminal_leaves_them():
    out = (b"\x1b[31mred\x1b(B\x1b[m ok\n\x1b]0;a title\x07Traceback (most recent call last):\n"
           b"  10%\r  50%\r\n\n   \nValueError: bad row 7\n\n")
    assert lastlines.from_output(out) == ["red ok", "Traceback (most recent call last):",
                                          "  50%", "ValueError: bad row 7"]


def test_only_the_last_twenty_are_kept_each_cut_and_a_cut_first_line_dropped():
    out = b"piece of a line\n" + b"".join(b"line %d\n" % n for n in range(30)) + b"x" * 900
    kept = lastlines.from_output(out, cut=True)
    assert len(kept) == lastlines.KEEP
    assert kept[0] == "line 11" and kept[-1] == "x" * lastlines.MAX_LINE
    assert lastlines.from_output(b"only a piece", cut=True) == ["only a piece"]


def test_bad_bytes_and_controls_never_break_the_reading():
    assert lastlines.from_output(b"\xff\xfe bad \x00\x07 bytes\n") == ["\ufffd\ufffd bad  bytes"]
    assert lastlines.from_output(b"") == []
    assert lastlines.from_output(b"\x1b[") == []


def test_of_log_reads_only_the_end_of_a_large_log(tmp_path):
    log = tmp_path / "stdio.log"
    log.write_bytes(b"y" * 100_000 + b"\nthe end\n")
    assert lastlines.of_log(str(log)) == ["the end"]  # the piece of the y line is dropped
    assert lastlines.of_log(str(tmp_path / "missing")) == []


@pytest.mark.parametrize(("status", "line", "reason"), [
    (IMPROPER, "ValueError: bad row 7", "ValueError: bad row N — PROCESS EXITED IMPROPERLY - "
     "MOVING TO ERR - Completion was but exit status was pid N exit N"),
    ("", "KeyError: 'x'", "KeyError: 'x' — "),
    ("could not reach db01", "a log line", "could not reach dbN"),  # the script said why
    (IMPROPER, "", "PROCESS EXITED IMPROPERLY - MOVING TO ERR - Completion was but exit "
     "status was pid N exit N"),
])
def test_a_reason_takes_the_last_line_only_when_the_status_says_only_how(status, line,
                                                                          reason):
    assert reason_of(status, line) == reason


def test_two_exceptions_are_two_groups_and_numbers_are_folded():
    groups = Groups()
    groups.add("a", IMPROPER, 1.0, "ValueError: bad row 7")
    groups.add("b", IMPROPER.replace("4242", "4243"), 2.0, "ValueError: bad row 9")
    groups.add("c", IMPROPER, 3.0, "KeyError: 'x'")
    listing = groups.listing()
    assert [(g["count"], g["reason"].split(" — ")[0]) for g in listing] == [
        (2, "ValueError: bad row N"), (1, "KeyError: 'x'")]
    assert listing[0]["last_line"] == "ValueError: bad row 7"
    assert groups.members(group_key(reason_of(IMPROPER, "ValueError: bad row 1"))) == ["a", "b"]


def test_lines_read_back_are_the_lines_kept_even_with_unicode_line_breaks(tmp_path):
    lines = lastlines.from_output("first\nValueError: a\u2028b\x85c\n".encode())
    assert lines == ["first", "ValueError: a\u2028b\x85c"]
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / lastlines.FILE).write_bytes(lastlines.encode(lines))
    assert lastlines.read(tmp_path / "m") == lines
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:  # the walk after a restart keys the group on the same line as the live event
        assert lastlines.read_at(dfd, "m") == lines[-1]
    finally:
        os.close(dfd)


def test_a_runs_own_lines_begin_where_its_output_did(tmp_path):
    log = tmp_path / "stdio.log"
    log.write_bytes(b"first run\nKeyError: a\n")
    at = log.stat().st_size
    with log.open("ab") as out:
        out.write(b"second run\nValueError: b\n")
    assert lastlines.of_run(str(log), at) == (["second run", "ValueError: b"],
                                              log.stat().st_size)
    assert lastlines.of_run(str(log), 0)[0] == ["first run", "KeyError: a", "second run",
                                                "ValueError: b"]
    # a log cut short since (by hand): all of it; none at all: nothing
    assert lastlines.of_run(str(log), 10 ** 6)[0][0] == "first run"
    assert lastlines.of_run(str(tmp_path / "none"), 0) == ([], 0)


def test_a_long_runs_own_lines_are_read_from_its_window_only(tmp_path):
    log = tmp_path / "stdio.log"
    log.write_bytes(b"old\n" + b"x" * (lastlines.WINDOW * 2) + b"\ncut line\nlast\n")
    lines, size = lastlines.of_run(str(log), 4)
    assert lines[-2:] == ["cut line", "last"] and size == log.stat().st_size
    assert "old" not in lines
