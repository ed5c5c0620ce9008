"""Hostile input, fuzzed: the queue-script pipe grammar and the queue socket protocol.

(a) Every line a script can write on fd 3 (binary, huge, partial, ``\\r``,
NUL, invalid UTF-8, every command with any text) is parsed into a command or
refused with ``ProtocolError``, never anything else; how the bytes are cut
into reads changes nothing.  (b) A real queue daemon fed arbitrary request
lines (JSON or not, unknown ops, wrong types for every field of every op,
stray files, lines cut short) answers each with ``{"ok": false, ...}`` or a
valid answer, never an internal error, still answers ``ping`` on a new
connection, and still holds the messages it acknowledged before.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from conftest import DaemonProcess, wait_for
from daemon_util import settle
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from rqsys.errors import ProtocolError
from rqsys.run.protocol import COMMANDS, MAX_TEXT, Command, parse_line
from rqsys.run.spawn import Child
from rqsys.run.verdict import Worker
from rqsys.scan.scandir import install_queue
from rqsys.store import Layout
from rqsys.wire import framing
from rqsys.wire.schema import OPS

# ------------------------------------------------------------------ (a) pipe grammar

WORDS = sorted(COMMANDS) + ["", "RUN", "done\r", "dup\x00", "rélayed", "resend\t"]
DIGITS = st.one_of(st.sampled_from("0123456789"), st.characters(categories=["Nd", "No"]),
                   st.sampled_from("\u00b2\u00b9\u2460\u0663\uff11"))  # isdigit(), some not decimal
DELAY = st.text(DIGITS, max_size=12) | st.text(max_size=6)
TEXT_BYTES = st.one_of(
    st.binary(max_size=200),
    st.text(max_size=200).map(str.encode),
    st.builds(lambda d, rest: f"{d}-{rest}".encode(), DELAY, st.text(max_size=40)),
    st.builds(lambda d, x, dest: f"{d}-{x}-{dest}".encode(), DELAY, st.text(max_size=3),
              st.text(max_size=40)),
)
STRUCTURED = st.builds(lambda w, sep, text, end: w.encode() + sep + text + end,
                       st.sampled_from(WORDS), st.sampled_from([b" ", b"", b"  ", b"\t"]),
                       TEXT_BYTES, st.sampled_from([b"", b"\r", b"\x00", b"\xff", b"\r\r"]))
HUGE = st.builds(lambda w, fill, n: w.encode() + b" " + fill * n, st.sampled_from(WORDS),
                 st.sampled_from([b"9", b"x", b"\x00", b"\xff", b"-", b"9-"]),
                 st.integers(MAX_TEXT - 2, 70_000))
DELAYED = st.builds(lambda w, d, rest: f"{w} {d}-{rest}".encode(),  # resend and dup, aimed
                    st.sampled_from(["resend", "dup"]), DELAY, st.text(max_size=20))
LINES = st.one_of(STRUCTURED, DELAYED, st.binary(max_size=300), HUGE)


def parse_or_refuse(raw: bytes) -> Command | None:
    """The parsed command, or None when refused with ProtocolError (nothing else)."""
    try:
        cmd = parse_line(raw)
    except ProtocolError:
        return None
    assert cmd.kind in COMMANDS and len(cmd.text) <= MAX_TEXT
    assert isinstance(cmd.due, int) and cmd.due >= 0
    assert cmd.kind != "dup" or cmd.dest.strip()
    return cmd


@settings(max_examples=600, deadline=None, database=None)
@example(b"resend 5-later\r")
@example(b"done \xff\xfe\x00ok")
@example(b"dup 0-x-http://example.invalid/q/a")
@given(LINES)
def test_every_script_line_is_a_command_or_a_protocol_error(raw):
    parse_or_refuse(raw)


@pytest.mark.parametrize("line", ["resend \u00b2-x", "dup \u00b9-x-q", "resend 1\u2460-x",
                                  f"resend {'9' * 400}-x", f"dup {'9' * 400}-x-q"])
def test_a_non_decimal_digit_delay_is_refused(line):
    with pytest.raises(ProtocolError):
        parse_line(line.encode())


BIG_DELAY = "9" * 400  # a number of seconds no float holds


@pytest.mark.parametrize("writes, state", [
    (r"printf 'run \xff\xfe\x00\r\nbogus\n\x00\n\ndone ok\n'", "done"),
    (r"head -c 300000 /dev/zero | tr '\0' x; printf '\nerr after a huge line\n'", "err"),
    # a line counts only once its newline came: an unended "done" is no done
    (r"if [ $RQ_COUNT -lt 1 ]; then printf 'resend 0-soon\r\n'; "
     r"else printf 'done cut short'; fi", "err"),
    (r"printf 'dup 0-x-no/such queue\n'; read -r answer <&4; echo done $answer", "done"),
])
def test_hostile_script_output_ends_only_its_message(make_queue, daemon, writes, state):
    make_queue("q", f"{{ {writes}; }} >&3\n")
    proc = daemon("q")
    msg_id = proc.call("create", msg={})["msg_id"]
    reply = settle(proc, msg_id, ("done", "err"))
    assert (reply["state"], proc.call("ping")["ok"]) == (state, True), reply


@pytest.mark.parametrize("line", ["resend \u00b2-x", f"resend {BIG_DELAY}-x",
                                  f"dup {BIG_DELAY}-x-q"])
def test_a_script_line_never_ends_its_daemon(make_queue, daemon, line):
    make_queue("q", f"echo '{line}' >&3\n")
    proc = daemon("q")
    msg_id = proc.call("create", msg={})["msg_id"]
    wait_for(lambda: proc.proc.poll() is not None or _ran(proc, msg_id),
             what="the script to have run, or its daemon to end")
    assert proc.proc.poll() is None, proc.stderr_text()[-300:]
    assert proc.call("ping")["ok"]


def _ran(proc: DaemonProcess, msg_id: str) -> bool:
    got = proc.call("get", msg_id=msg_id)
    return got["state"] != "run" and bool(got["status"])


def _worker_reading(r: int) -> Worker:
    """A Worker whose script's fd 3 is the pipe read end ``r`` (no script runs)."""
    return Worker("20260101.0000.00.000", {}, Child(pid=0, pidfd=-1, status_r=r, reply_w=-1))


def _read_in_chunks(data: bytes, sizes: list[int]) -> list[Any]:
    """What a Worker makes of ``data`` written to a real pipe in pieces of ``sizes``."""
    r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    worker, seen, pos = _worker_reading(r), [], 0
    try:
        for size in [*sizes, len(data)]:
            piece, pos = data[pos:pos + max(size, 1)][:60_000], pos + min(max(size, 1), 60_000)
            if piece:
                os.write(w, piece)
            got, _eof = worker.read_lines()
            seen += got
            if pos >= len(data):
                break
        while pos < len(data):  # the rest, in pipe-sized pieces
            os.write(w, data[pos:pos + 60_000])
            pos += 60_000
            seen += worker.read_lines()[0]
        os.close(w)
        w = -1
        seen += worker.read_lines()[0]
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)
    return [(type(x).__name__, x if isinstance(x, Command) else str(x)) for x in seen]


@settings(max_examples=150, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(LINES, max_size=6),
       st.lists(st.integers(1, 70_000), max_size=8), st.booleans())
def test_how_the_script_cuts_its_writes_changes_nothing(lines, sizes, partial_tail):
    data = b"\n".join(lines) + (b"" if partial_tail else b"\n")
    whole = _read_in_chunks(data, [60_000])
    assert _read_in_chunks(data, sizes) == whole
    assert all(kind in ("Command", "ProtocolError") for kind, _ in whole)


# ------------------------------------------------------------------ (b) socket protocol

QUEUE = "fz"
DESTRUCTIVE = {"prune", "adminoper", "delete", "destroy", "run_now", "commit", "reload", "clone"}
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(max_size=30) | st.sampled_from(["que", "prep", "done", "20260101.0000.00.000",
                                              "../etc", "a\x00b", "x" * 300]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                               max_size=4),
    max_leaves=12)
FIELDS = sorted({f for schema in OPS.values() for f in schema["properties"]})


GOOD = {  # near-valid values per field, so that requests get past the schema too
    "msg_id": st.sampled_from(["20260101.0000.00.000", "20260101.0000.00.000.7",
                               "20260101.0000.00.00", "../20260101.0000.00.000"]),
    "name": st.sampled_from(["a.bin", "..", "x/y", "", "a" * 201, ".hidden", "a\x00"]),
    "md5": st.sampled_from(["0" * 32, "d41d8cd98f00b204e9800998ecf8427e", "F" * 32, "x"]),
    "state": st.sampled_from(["que", "prep", "done", "run", "bogus"]),
    "oper": st.sampled_from(["pause", "down", "bogus", "UP"]),
    "offset": st.integers(-5, 10**30), "limit": st.integers(-5, 10**30),
    "days": st.floats(min_value=-1), "prep_days": st.none() | st.floats(min_value=-1),
    "single": st.booleans(), "refuse_paused": st.booleans(),
}
OFTEN = st.sampled_from([True] * 9 + [False])  # hypothesis leans to the simplest choice
MSG_FIELDS = ["param1", "param2", "dest", "due", "count", "max_count", "msg_id", "status",
              "_attachments", "x"]


@st.composite
def requests(draw) -> dict[str, Any]:
    """Mostly a known op with its required fields and some optional ones, each
    near-valid or of any type; sometimes an unknown op, a stray field, no op."""
    op = draw(st.sampled_from(sorted(OPS)) if draw(OFTEN) else st.text(max_size=20) | JSON_VALUES)
    schema = OPS.get(op) if isinstance(op, str) else None
    required = [f for f in (schema or {}).get("required", []) if f != "op"]
    optional = [f for f in (schema or {}).get("properties", {}) if f not in required + ["op"]]
    names = [f for f in required if draw(OFTEN)]
    names += draw(st.lists(st.sampled_from(optional), unique=True)) if optional else []
    if not draw(OFTEN):
        names.append(draw(st.sampled_from(FIELDS) | st.text(max_size=8)))
    req = {name: draw(_value_for(name)) for name in names}
    if draw(OFTEN):
        req["op"] = op
    assume(harmless(req))
    return req


def harmless(obj: Any) -> bool:
    """False for a *valid* request that may remove or run the messages the test
    keeps (resume, delete, prune of prep, ...): those are answered ok, rightly."""
    op = obj.get("op") if isinstance(obj, dict) else None
    if not (isinstance(op, str) and op in DESTRUCTIVE):
        return True
    if not jsonschema.Draft202012Validator(OPS[op]).is_valid(obj):
        return True
    if op == "prune":  # prune of prep older than under a day would take the kept one
        return obj.get("prep_days") is None or obj["prep_days"] >= 1
    return op == "adminoper" and obj["oper"] == "pause"


def _value_for(name: str) -> st.SearchStrategy[Any]:
    if name == "msg":
        fields = st.dictionaries(st.sampled_from(MSG_FIELDS), JSON_VALUES | st.text(
            max_size=2000), max_size=5)
        return st.one_of(fields, fields, fields, JSON_VALUES)
    if name == "attachments":
        return JSON_VALUES | st.lists(st.fixed_dictionaries(
            {"name": GOOD["name"] | JSON_VALUES, "md5": GOOD["md5"] | JSON_VALUES}), max_size=3)
    if name in GOOD:  # near-valid three times in four
        return st.one_of(GOOD[name], GOOD[name], GOOD[name], JSON_VALUES)
    return JSON_VALUES


REQUEST_BYTES = requests().map(lambda r: json.dumps(r).encode())
LINE_BYTES = st.one_of(
    REQUEST_BYTES,
    JSON_VALUES.filter(harmless).map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=200).map(lambda b: b.replace(b"\n", b" ")),
    st.text(max_size=100).map(lambda t: t.replace("\n", " ").encode()),
)


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory):
    """A real, paused queue daemon holding one queued and one prep message,
    each with an attachment; returns (daemon, {id: (state, msg, md5)})."""
    root = tmp_path_factory.mktemp("fuzz") / "root"
    layout = Layout(root, root / "sock")
    layout.make_dirs()
    layout.socket_dir.mkdir()
    entry = root / "scripts" / QUEUE
    entry.mkdir(parents=True)
    (entry / "run").write_text("#!/bin/sh\necho done >&3\n")
    (entry / "run").chmod(0o755)
    install_queue(layout, QUEUE, entry)
    proc = DaemonProcess(layout, QUEUE)
    try:
        proc.call("adminoper", oper="pause")
        kept = {_create(proc, root, state): state for state in ("que", "prep")}
        yield proc, kept
        _still_there(proc, kept)
    finally:
        assert proc.stop() == 0


def _create(proc: DaemonProcess, root: Path, state: str) -> str:
    data = os.urandom(4000)
    path = root / f"kept-{state}.bin"
    path.write_bytes(data)
    with open(path, "rb") as f:
        reply = proc.call("create", fds=[f.fileno()], state=state,
                          msg={"param1": f"kept in {state}", "param2": "\u00e9\u2028"},
                          attachments=[{"name": "kept.bin", "md5": hashlib.md5(data).hexdigest()}])
    return str(reply["msg_id"])


def _still_there(proc: DaemonProcess, kept: dict[str, str]) -> None:
    for msg_id, state in kept.items():
        got = proc.call("get", msg_id=msg_id)
        assert got["state"] == state and got["msg"]["param1"] == f"kept in {state}"
        assert got["msg"]["param2"] == "\u00e9\u2028"
        mdir = proc.layout.queue_dir(QUEUE) / state / msg_id
        sent = (proc.layout.root / f"kept-{state}.bin").read_bytes()
        assert (mdir / "attach" / "kept.bin").read_bytes() == sent


def _connect(proc: DaemonProcess) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(str(proc.layout.socket_path(QUEUE)))
    return sock


def _answers(sock: socket.socket, count: int) -> list[dict[str, Any]]:
    """Up to ``count`` answer lines, fewer if the daemon closes the connection."""
    lines = framing.LineBuffer()
    answers = []
    while len(answers) < count:
        got = lines.next_line()
        if got is not None:
            answers.append(json.loads(got[0]))
            continue
        data = sock.recv(65536)
        if not data:
            break
        lines.feed(data, [])
    return answers


def _check_answer(answer: dict[str, Any]) -> None:
    assert isinstance(answer, dict) and isinstance(answer.get("ok"), bool), answer
    if not answer["ok"]:
        assert isinstance(answer.get("error"), str) and answer["error"], answer
        assert answer.get("kind") not in ("InternalError", "StoreError"), answer


def _ping(proc: DaemonProcess) -> None:
    with _connect(proc) as sock:
        sock.sendall(b'{"op":"ping"}\n')
        assert _answers(sock, 1)[0]["ok"] is True


def _exchange(proc: DaemonProcess, lines: list[bytes], cut_last: bool, with_fds: int) -> None:
    """Send the lines on a new connection (the last maybe without its newline,
    then half-closed), with ``with_fds`` open files; check every answer."""
    with _connect(proc) as sock, open("/dev/null", "rb") as null:
        data = b"\n".join(lines) + (b"" if cut_last else b"\n")
        framing.send(sock, data, [null.fileno()] * with_fds)
        if cut_last:
            sock.shutdown(socket.SHUT_WR)
        for answer in _answers(sock, len(lines) - cut_last):
            _check_answer(answer)
    _ping(proc)


FUZZ = settings(deadline=None, database=None, suppress_health_check=[
    HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.filter_too_much])


@settings(FUZZ, max_examples=400)
@example([{"op": "create", "msg": {"param1": "x"}, "attachments": [{"name": "a", "md5": "x"}]}],
         1)
@example([{"op": "attach", "msg_id": "20260101.0000.00.000", "name": "..", "md5": "0" * 32}], 1)
@given(st.lists(requests(), min_size=1, max_size=3), st.sampled_from([0, 0, 1, 2]))
def test_the_daemon_answers_any_request(fuzzed, reqs, with_fds):
    proc, _kept = fuzzed
    _exchange(proc, [json.dumps(r).encode() for r in reqs], False, with_fds)


@settings(FUZZ, max_examples=150)
@given(st.lists(LINE_BYTES, min_size=1, max_size=3), st.booleans(), st.integers(0, 2))
def test_the_daemon_answers_any_line(fuzzed, lines, cut_last, with_fds):
    proc, _kept = fuzzed
    _exchange(proc, lines, cut_last, with_fds)


def test_a_line_over_the_limit_is_refused_and_the_daemon_goes_on(fuzzed):
    proc, _kept = fuzzed
    with _connect(proc) as sock:
        try:
            sock.sendall(b'{"op":"ping","x":"' + b"y" * (framing.MAX_LINE + 4096))
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed after its error answer while the rest was still on the way
        answers = _answers(sock, 1)
    assert answers and answers[0]["ok"] is False and "longer than" in answers[0]["error"]
    _ping(proc)
