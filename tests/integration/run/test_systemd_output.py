"""Script output to stdio.log and journald (rqsys.run.output), and RQ_IDLE_TIMEOUT.

journald here is a real datagram socket bound in a temp dir that receives
the native protocol exactly as /run/systemd/journal/socket would; the real
journald is in test_systemd.py.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rqsys.errors import ConfigError
from rqsys.run.output import MAX_LINE, JournalSender, ScriptOutput, journal_fields, split_lines
from rqsys.systemd import default_idle_timeout


def parse_native(data: bytes) -> dict[str, bytes]:
    """Decode one journald native datagram (systemd.journal-fields(7))."""
    fields, pos = {}, 0
    while pos < len(data):
        end = data.index(b"\n", pos)
        line = data[pos:end]
        if b"=" in line:
            key, value = line.split(b"=", 1)
            pos = end + 1
        else:
            size = int.from_bytes(data[end + 1:end + 9], "little")
            key, value = line, data[end + 9:end + 9 + size]
            pos = end + 9 + size + 1
        fields[key.decode()] = value
    return fields


@pytest.fixture
def journald(tmp_path: Path) -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "journal.sock"))
    sock.settimeout(5)
    yield sock
    sock.close()


def received(sock: socket.socket) -> list[dict[str, bytes]]:
    sock.setblocking(False)
    got = []
    try:
        while True:
            got.append(parse_native(sock.recv(1 << 20)))
    except BlockingIOError:
        return got


def test_split_lines_keeps_the_partial_tail_and_cuts_long_lines() -> None:
    assert split_lines(b"", b"a\nbc") == ([b"a"], b"bc")
    assert split_lines(b"bc", b"d\n\n") == ([b"bcd", b""], b"")
    long = b"x" * (2 * MAX_LINE + 5)
    assert split_lines(b"", long + b"\n") == ([b"x" * MAX_LINE] * 2 + [b"xxxxx"], b"")
    assert split_lines(b"", long) == ([b"x" * MAX_LINE] * 2, b"xxxxx")


def test_journal_fields_native_format_round_trips() -> None:
    fields = {"MESSAGE": b"two\nlines", "RQ_COUNT": "3"}
    assert parse_native(journal_fields(fields)) == {"MESSAGE": b"two\nlines", "RQ_COUNT": b"3"}


def pump_all(output: ScriptOutput, sel: selectors.BaseSelector) -> None:
    while output.pumps:
        for key, mask in sel.select(5):
            key.data(key, mask)


def test_script_output_goes_to_log_and_journal_with_fields(tmp_path: Path,
                                                           journald: socket.socket) -> None:
    # Given script output opened under journald for message m1, run 2
    sel = selectors.DefaultSelector()
    output = ScriptOutput("q1", sel, journal=True)
    assert output.journal is not None
    output.journal.path = journald.getsockname()
    fd = output.open(tmp_path / "stdio.log", "m1", 2)
    # When the "script" writes lines, one too long, and a last line without newline
    text = b"first\n" + b"y" * (MAX_LINE + 1) + b"\nlast"
    os.write(fd, text)
    os.close(fd)
    pump_all(output, sel)
    # Then stdio.log has every byte, and journald got each line with the fields
    assert (tmp_path / "stdio.log").read_bytes() == text
    entries = received(journald)
    assert [e["MESSAGE"] for e in entries] == [b"first", b"y" * MAX_LINE, b"y", b"last"]
    for entry in entries:
        assert (entry["RQ_QUEUE"], entry["RQ_MSG_ID"], entry["RQ_COUNT"]) == (b"q1", b"m1", b"2")


def test_journald_gone_loses_nothing_from_stdio_log(tmp_path: Path) -> None:
    sel = selectors.DefaultSelector()
    output = ScriptOutput("q1", sel, journal=True)
    assert output.journal is not None
    output.journal.path = str(tmp_path / "no-journald.sock")
    fd = output.open(tmp_path / "stdio.log", "m1", 1)
    os.write(fd, b"a\nb\n")
    os.close(fd)
    pump_all(output, sel)
    assert (tmp_path / "stdio.log").read_bytes() == b"a\nb\n"
    assert output.journal.dropped == 2


def test_without_journald_the_script_writes_stdio_log_itself(tmp_path: Path) -> None:
    sel = selectors.DefaultSelector()
    output = ScriptOutput("q1", sel, journal=False)
    fd = output.open(tmp_path / "stdio.log", "m1", 1)
    os.write(fd, b"direct\n")
    os.close(fd)
    assert not output.pumps and not sel.get_map()
    assert (tmp_path / "stdio.log").read_bytes() == b"direct\n"


def test_a_full_journal_socket_never_blocks(tmp_path: Path, journald: socket.socket) -> None:
    # Given journald that reads nothing, when far more than its buffer is sent
    sender = JournalSender(journald.getsockname())
    sent = sum(sender.send({"MESSAGE": b"z" * 4000}) for _ in range(5000))
    # Then sends return at once and what did not fit is counted as dropped
    assert sender.dropped > 0 and sent + sender.dropped == 5000
    sender.close()


@pytest.mark.parametrize(("value", "seconds"), [("", 0.0), ("0", 0.0), ("2.5", 2.5),
                                                 ("300", 300.0)])
def test_idle_timeout_from_environment(value: str, seconds: float) -> None:
    assert default_idle_timeout({"RQ_IDLE_TIMEOUT": value}) == seconds
    assert default_idle_timeout({}) == 0.0


@pytest.mark.parametrize("value", ["soon", "-1", "inf", "nan", "1e999"])
def test_idle_timeout_bad_values_are_config_errors(value: str) -> None:
    with pytest.raises(ConfigError, match="RQ_IDLE_TIMEOUT"):
        default_idle_timeout({"RQ_IDLE_TIMEOUT": value})


def test_a_run_without_a_job_dir_gets_one_under_journald(tmp_path: Path,
                                                         journald: socket.socket) -> None:
    # Given a run whose message brought no job/ (no spare) under journald
    sel = selectors.DefaultSelector()
    output = ScriptOutput("q1", sel, journal=True)
    assert output.journal is not None
    output.journal.path = journald.getsockname()
    job = tmp_path / "run" / "m1" / "job"
    job.parent.mkdir(parents=True)
    # When its stdout is opened, job/ is made and the output reaches stdio.log
    fd = output.stdout_fd(str(job), "m1", 0)
    assert fd is not None
    os.write(fd, b"hello\n")
    os.close(fd)
    pump_all(output, sel)
    assert (job / "stdio.log").read_bytes() == b"hello\n"
    # And without journald the script's start opens it (nothing to give it)
    assert ScriptOutput("q1", sel, journal=False).stdout_fd(str(job), "m2", 0) is None


OUT_OF_FDS = """if 1:
    import json, os, resource, selectors, sys
    from rqsys.errors import SpawnError
    from rqsys.run.output import ScriptOutput
    journald, job, spare = sys.argv[1], sys.argv[2], int(sys.argv[3])
    output = ScriptOutput("q1", selectors.DefaultSelector(), journal=True)
    output.journal.path = journald
    lowest = os.open(os.devnull, os.O_RDONLY)
    os.close(lowest)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest + spare, hard))
    try:
        output.stdout_fd(job, "m1", 0)
        error = ""
    except SpawnError as exc:
        error = str(exc)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    probe = os.open(os.devnull, os.O_RDONLY)
    print(json.dumps({"error": error, "leaked": probe != lowest, "pumps": len(output.pumps)}))
"""


@pytest.mark.parametrize("spare", [1, 0])  # the log opens and the pipe does not; or neither
def test_out_of_fds_is_a_failed_start_not_a_crash(tmp_path: Path, journald: socket.socket,
                                                  spare: int) -> None:
    # Given a daemon under journald with its fds used up (a real EMFILE, in a
    # process of its own: this one's threads open and close fds meanwhile)
    job = tmp_path / "job"
    job.mkdir()
    # When a script's output is opened
    got = subprocess.run([sys.executable, "-c", OUT_OF_FDS, journald.getsockname(), str(job),
                          str(spare)], capture_output=True, text=True, timeout=60, check=True)
    result = json.loads(got.stdout)
    # Then the start fails with the reason, and nothing is left open
    assert re.fullmatch(r"cannot open the script's output .*/job/stdio\.log: "
                        r"Too many open files", result["error"]), result
    assert not result["leaked"] and result["pumps"] == 0
