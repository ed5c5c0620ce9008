"""Journal triggers (issue 49) with a real journald, a real ``rqsys serve`` and its
rq-scan: 1,000 entries sent with ``systemd.journal.send`` across a SIGKILL of
rq-scan are exactly 1,000 messages, each with its entry attached; a burst past
a low rate limit is its limit of messages and one saying how many were folded;
entries that do not match (another identifier, a priority outside the range)
make nothing, nor do those after the trigger's file is removed.

journald is the host's own when one answers on /run/systemd/journal/socket;
else this module starts ``/lib/systemd/systemd-journald`` standalone (root
only) and stops that process, by its pid, at the end."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import need, wait_for
from scan_util import DEADLINE, call, make_entry, start_serve, started
from test_file_triggers import messages, record, scan_pid, write_trigger

from rqsys.store import Layout
from rqsys.triggers import listing

JOURNALD = Path("/lib/systemd/systemd-journald")
SOCKET = Path("/run/systemd/journal/socket")


def _answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(str(path))
        except OSError:
            return False
    return True


def _readable(ident: str) -> bool:
    from systemd import journal

    reader = journal.Reader()
    try:
        reader.add_match(f"SYSLOG_IDENTIFIER={ident}")
        return bool(reader.get_next())
    finally:
        reader.close()


@pytest.fixture(scope="module")
def journald() -> Iterator[None]:
    """A journald on /run/systemd/journal: the host's, or one started here."""
    from systemd import journal

    proc, before = None, _entries(SOCKET.parent)
    if not _answers(SOCKET):
        need(os.geteuid() == 0 and JOURNALD.exists(), "a journald (root runs it standalone)")
        proc = subprocess.Popen([str(JOURNALD)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lambda: _answers(SOCKET), DEADLINE, "journald's socket")
        probe = f"rqsys-probe-{uuid.uuid4().hex[:8]}"
        journal.send("probe", SYSLOG_IDENTIFIER=probe)
        wait_for(lambda: _readable(probe), DEADLINE, "the probe entry read back")
        yield
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
            for name in _entries(SOCKET.parent) - before:  # its sockets: the host as found
                (SOCKET.parent / name).unlink(missing_ok=True)


def _entries(path: Path) -> set[str]:
    try:
        return set(os.listdir(path))
    except FileNotFoundError:
        return set()


@pytest.fixture
def scandir(tmp_path: Path) -> Path:
    path = tmp_path / "scandir"
    path.mkdir()
    make_entry(tmp_path / "scripts", "jq", 'echo "done ok" >&3', num_workers=4)
    (path / "jq").symlink_to(tmp_path / "scripts" / "jq")
    return path


@pytest.fixture
def serve(layout: Layout, scandir: Path, tmp_path: Path) -> Iterator[Any]:
    yield from started(lambda: start_serve(layout, scandir, tmp_path / "serve.log"))


def journal_trigger(match: dict[str, str], limit: int, per: float) -> dict[str, Any]:
    return {"journal": {"match": match}, "msg": {"dest": "jq", "param2": "from-journal"},
            "rate_limit": {"limit": limit, "per": per}}


def of(layout: Layout, name: str) -> list[tuple[str, Path, dict[str, Any]]]:
    return [m for m in messages(layout, "jq")
            if m[2].get("unique_key", "").startswith(f"journal:{name}:")]


def following(layout: Layout, proc: Any, name: str) -> None:
    """rq-scan has taken the trigger in and noted where it starts."""
    proc.wait_log(f"trigger {name} added")
    state = layout.root / "triggers" / ".state" / f"{name}.journal.json"
    wait_for(state.exists, DEADLINE, "the trigger's state file")


def test_1000_entries_across_a_kill_each_exactly_one_message(journald, layout, serve):
    from systemd import journal

    # Given rqsys serve with a journal trigger on an identifier of this test only
    ident, other = f"rqsys-test-{uuid.uuid4().hex[:8]}", f"rqsys-other-{uuid.uuid4().hex[:8]}"
    proc = serve()
    write_trigger(layout, "j1", journal_trigger({"SYSLOG_IDENTIFIER": ident}, 100000, 1))
    following(layout, proc, "j1")
    # When 1,000 entries come (and others beside them), rq-scan SIGKILLed midway
    for n in range(400):
        journal.send(f"entry {n}", SYSLOG_IDENTIFIER=ident, RQ_TEST_N=str(n))
        journal.send(f"other {n}", SYSLOG_IDENTIFIER=other)
    wait_for(lambda: len(of(layout, "j1")) >= 100, DEADLINE, "some messages made")
    pid = scan_pid(proc)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    for n in range(400, 1000):
        journal.send(f"entry {n}", SYSLOG_IDENTIFIER=ident, RQ_TEST_N=str(n))
    proc.wait_log("rq-scan ready", count=2)
    # Then each entry is exactly one message, its fields attached
    found = wait_for(lambda: (m := of(layout, "j1")) and len(m) >= 1000 and m, 4 * DEADLINE,
                     "1000 messages")
    time.sleep(1.5)  # more than a job's turn: nothing more comes
    found = of(layout, "j1")
    assert len(found) == 1000
    assert sorted(m["param1"] for _s, _d, m in found) == sorted(f"entry {n}"
                                                                for n in range(1000))
    for _state, mdir, msg in found[:50]:
        entry = json.loads((mdir / "attach" / "entry.json").read_text())
        assert entry["MESSAGE"] == msg["param1"] and entry["SYSLOG_IDENTIFIER"] == ident
        assert msg["param2"] == "from-journal"
        assert msg["unique_key"] == f"journal:j1:{entry['__CURSOR']}"
    fires = record(layout, "j1")
    # (a message made just before the kill may be counted as a duplicate after it)
    assert fires["made"] <= 1000 <= fires["made"] + fires["duplicate"]
    assert fires["refused"] == 0
    got = call(layout, "jq", "get", msg_id=found[0][1].name)
    assert "trigger j1" in json.dumps(got["timeline"][0]), got["timeline"]


def test_a_burst_past_the_rate_limit_is_folded_and_no_match_makes_nothing(
        journald, layout, serve):
    from systemd import journal

    # Given a trigger on an identifier and priorities 0..3, at most 5 messages in 8 s
    ident = f"rqsys-burst-{uuid.uuid4().hex[:8]}"
    proc = serve()
    write_trigger(layout, "j2", journal_trigger({"SYSLOG_IDENTIFIER": ident,
                                                 "PRIORITY": "0..3"}, 5, 8))
    following(layout, proc, "j2")
    # When entries that do not match come (priority 6, another identifier)
    journal.send("too low", SYSLOG_IDENTIFIER=ident, PRIORITY=6)
    journal.send("not ours", SYSLOG_IDENTIFIER=f"{ident}-x", PRIORITY=2)
    # and a burst of 20 that do (priorities 0 to 3)
    for n in range(20):
        journal.send(f"burst {n}", SYSLOG_IDENTIFIER=ident, PRIORITY=n % 4)
    # Then 5 messages at once, then one saying the other 15 were folded
    found = wait_for(lambda: (m := of(layout, "j2")) and len(m) >= 6 and m, DEADLINE,
                     "5 messages and the folded one")
    time.sleep(1.5)
    found = of(layout, "j2")
    params = sorted(m["param1"] for _s, _d, m in found)
    assert params == sorted([f"burst {n}" for n in range(5)] + ["folded 15 entries"])
    folded = next((d, m) for _s, d, m in found if m["param1"] == "folded 15 entries")
    told = json.loads((folded[0] / "attach" / "folded.json").read_text())
    assert told["folded"] == 15 and told["first_cursor"] != told["last_cursor"]
    assert folded[1]["unique_key"] == f"journal:j2:folded:{told['first_cursor']}"
    fires = record(layout, "j2")
    assert (fires["made"], fires["folded"], fires["refused"]) == (6, 15, 0)
    # and rq triggers lists it as served
    line = next(t for t in listing.lines(listing.list_triggers(layout)) if t.startswith("j2\t"))
    assert line.split("\t")[1:4] == ["journal", "jq", "made=6"] and "not served" not in line
    # and once its file is removed, a matching entry makes nothing (the window
    # has room: the 5 have left it, the folded one is alone there)
    (layout.root / "triggers" / "j2.json").unlink()
    proc.wait_log("trigger j2 removed")
    journal.send("after", SYSLOG_IDENTIFIER=ident, PRIORITY=3)
    time.sleep(1.5)
    assert len(of(layout, "j2")) == 6
