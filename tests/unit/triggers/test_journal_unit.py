"""The pure parts of journal triggers: match terms and PRIORITY ranges, an entry
made JSON, the message and its key, the rate window; and a trigger's work over
a journal of its own (a reader given to it, the queue daemon's create answered
here): where it starts, its cursor kept across a restart, a crash between
"made" and "written", a burst folded, no journal readable, a queue down."""

from __future__ import annotations

import datetime
import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from rqsys.errors import ConfigError, Unavailable
from rqsys.store import Layout
from rqsys.triggers import journal, journalwork, listing, record, spec
from rqsys.triggers.journalwork import JournalSpec, Window, Work


def test_priority_ranges_are_each_priority_and_other_fields_are_taken_as_they_are() -> None:
    assert journalwork.match_terms({"_SYSTEMD_UNIT": "nginx.service", "PRIORITY": "0..3"}) == (
        "PRIORITY=0", "PRIORITY=1", "PRIORITY=2", "PRIORITY=3", "_SYSTEMD_UNIT=nginx.service")
    assert journalwork.match_terms({"PRIORITY": "4"}) == ("PRIORITY=4",)
    assert journalwork.match_terms({"PRIORITY": "5..5"}) == ("PRIORITY=5",)
    assert journalwork.match_terms({"MESSAGE": "a..b"}) == ("MESSAGE=a..b",)
    for bad in ("3..0", "0..9", "a..b", "0...3"):
        with pytest.raises(ConfigError, match="a range is a..b"):
            journalwork.match_terms({"PRIORITY": bad})


def write(layout: Layout, name: str, data: dict[str, Any]) -> None:
    tdir = spec.triggers_dir(layout)
    tdir.mkdir(exist_ok=True)
    (tdir / f"{name}.json").write_text(json.dumps(data))


def test_a_trigger_file_is_its_spec_another_kind_none_a_bad_range_refused(
        layout: Layout) -> None:
    write(layout, "j", {"journal": {"match": {"PRIORITY": "0..1"}}, "msg": {"dest": "q"},
                        "rate_limit": {"limit": 3, "per": 60}, "params": {"param2": "$._PID"}})
    assert journal.load(layout, "j") == JournalSpec("j", ("PRIORITY=0", "PRIORITY=1"),
                                                    {"dest": "q"}, {"param2": "$._PID"}, 3, 60.0)
    write(layout, "f", {"files": {"path": "/tmp"}, "msg": {"dest": "q"}})
    assert journal.load(layout, "f") is None
    write(layout, "bad", {"journal": {"match": {"PRIORITY": "7..0"}}, "msg": {"dest": "q"}})
    with pytest.raises(ConfigError, match="bad.json: journal: match: PRIORITY"):
        journal.load(layout, "bad")
    # and rq triggers says so (the schema cannot)
    listed = {e["name"]: e for e in listing.list_triggers(layout)}
    assert listed["bad"]["error"].startswith("journal: match: PRIORITY '7..0'")
    assert listed["j"]["kind"] == "journal" and listed["j"]["error"] == "no queue named q"


def test_an_entry_is_json_bytes_times_and_ids_as_strings() -> None:
    boot = uuid.UUID("b3cb2e84-e1be-45dd-b1d7-d2e7c917244e")
    when = datetime.datetime(2026, 5, 30, 10, 12, 44, 5, tzinfo=datetime.UTC)
    doc = journalwork.entry_doc({
        "MESSAGE": "hi", "PRIORITY": 3, "_BOOT_ID": boot, "BIN": b"a\xffb",
        "__REALTIME_TIMESTAMP": when, "LIST": [b"x", "y"],
        "__MONOTONIC_TIMESTAMP": (datetime.timedelta(seconds=2, microseconds=7), boot)})
    assert doc == {"MESSAGE": "hi", "PRIORITY": 3, "_BOOT_ID": boot.hex, "BIN": "a\ufffdb",
                   "__REALTIME_TIMESTAMP": "2026-05-30T10:12:44.000005+00:00",
                   "LIST": ["x", "y"], "__MONOTONIC_TIMESTAMP": ["2000007", boot.hex]}
    json.dumps(doc)


def test_the_message_is_msg_with_message_as_param1_the_params_and_the_key() -> None:
    js = JournalSpec("j", ("A=1",), {"dest": "q", "param1": "mine", "param2": "p"},
                     {"param3": "$._PID"})
    doc = {"MESSAGE": "x" * 5000, "_PID": 12}
    made = journalwork.message(js, doc, json.dumps(doc).encode(), "journal:j:c1")
    assert made == {"dest": "q", "param1": "x" * journalwork.PARAM_MAX, "param2": "p",
                    "param3": "12", "unique_key": "journal:j:c1",
                    "unique_for": journalwork.UNIQUE_FOR}
    folded = journalwork.fold_message(js, {"count": 7, "first": "c2", "last": "c9"})
    assert folded["param1"] == "folded 7 entries" and folded["param2"] == "p"
    assert folded["unique_key"] == "journal:j:folded:c2"


def test_the_window_holds_limit_messages_in_per_seconds() -> None:
    window = Window(2, 10.0)
    assert window.room(100.0)
    window.take(100.0)
    window.take(103.0)
    assert not window.room(105.0) and window.free_in(105.0) == 5.0
    assert window.room(110.5) and window.free_in(110.5) == 0.0
    assert Window(None, 0.0).room(1.0)


# ------------------------------------------------------------------ a journal of its own
class Journal:
    """Entries in order, each with a cursor and a time."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []

    def add(self, message: str, at: float | None = None, **fields: Any) -> None:
        self.entries.append({"__CURSOR": f"c{len(self.entries):04d}", "MESSAGE": message,
                             "_at": time.time() if at is None else at, **fields})


class Reader:
    """What Work uses of ``systemd.journal.Reader``, over a Journal."""

    def __init__(self, journal: Journal, terms: tuple[str, ...], files: bool = True) -> None:
        self.journal, self.terms, self.files, self.at = journal, terms, files, 0

    def has_runtime_files(self) -> bool:
        return self.files

    def has_persistent_files(self) -> bool:
        return False

    def fileno(self) -> int:
        return 99

    def reliable_fd(self) -> bool:
        return True

    def close(self) -> None:
        pass

    def seek_cursor(self, cursor: str) -> None:
        self.at = [e["__CURSOR"] for e in self.journal.entries].index(cursor)

    def seek_realtime(self, since: float) -> None:
        self.at = next((n for n, e in enumerate(self.journal.entries) if e["_at"] >= since),
                       len(self.journal.entries))

    def _matches(self, entry: dict[str, Any]) -> bool:
        by_field: dict[str, set[str]] = {}
        for term in self.terms:
            name, value = term.split("=", 1)
            by_field.setdefault(name, set()).add(value)
        return all(str(entry.get(k)) in v for k, v in by_field.items())

    def get_next(self) -> dict[str, Any]:
        while self.at < len(self.journal.entries):
            entry = self.journal.entries[self.at]
            self.at += 1
            if self._matches(entry):
                return {k: v for k, v in entry.items() if k != "_at"}
        return {}


class Daemon:
    """The queue daemon's create, answered here: a key seen before is a duplicate."""

    def __init__(self) -> None:
        self.made: dict[str, dict[str, Any]] = {}
        self.down = False

    def create(self, msg: dict[str, Any], attach: str, body: bytes) -> dict[str, Any]:
        if self.down:
            raise Unavailable("the queue daemon did not answer")
        key = msg["unique_key"]
        dup = key in self.made
        self.made.setdefault(key, {**msg, "attach": attach, "body": json.loads(body)})
        return {"msg_id": f"m{list(self.made).index(key)}", "duplicate": dup}


class Served(Work):
    """A Work whose creates go to a Daemon."""

    def __init__(self, layout: Layout, daemon: Daemon, journal: Journal,
                 files: bool = True) -> None:
        super().__init__(layout, "j", lambda terms: Reader(journal, terms, files))
        self.daemon = daemon

    def _create(self, js: JournalSpec, msg: dict[str, Any], attach: str,
                body: bytes) -> dict[str, Any]:
        return self.daemon.create(msg, attach, body)


def js_of(limit: int | None = None, per: float = 0.0) -> JournalSpec:
    return JournalSpec("j", ("SYSLOG_IDENTIFIER=app",), {"dest": "q"}, {}, limit, per)


def fires(layout: Layout) -> dict[str, Any]:
    return record.read(spec.triggers_dir(layout), "j")


def test_it_starts_now_keeps_its_cursor_and_a_restart_neither_repeats_nor_skips(
        layout: Layout) -> None:
    # Given entries already in the journal when the trigger is first seen
    journal, daemon = Journal(), Daemon()
    journal.add("old", at=time.time() - 60, SYSLOG_IDENTIFIER="app")
    work = Served(layout, daemon, journal)
    work.run(js_of())
    # When entries come, some not matching
    for n in range(3):
        journal.add(f"new {n}", SYSLOG_IDENTIFIER="app")
        journal.add(f"other {n}", SYSLOG_IDENTIFIER="else")
    out = work.run(js_of())
    # Then each matching one is one message, the old one none
    assert [m["param1"] for m in daemon.made.values()] == ["new 0", "new 1", "new 2"]
    assert out.fd == 99 and out.wake_in is None
    assert all(m["attach"] == "entry.json" and m["body"]["MESSAGE"] == m["param1"]
               for m in daemon.made.values())
    state = json.loads((work.path).read_text())
    assert state["cursor"] == "c0005"  # new 2's
    # and after a restart (a new Work on the same root), only what came since
    journal.add("after", SYSLOG_IDENTIFIER="app")
    Served(layout, daemon, journal).run(js_of())
    assert [m["param1"] for m in daemon.made.values()][-2:] == ["new 2", "after"]
    assert len(daemon.made) == 4 and fires(layout)["made"] == 4


def test_a_crash_between_made_and_written_is_answered_duplicate(layout: Layout) -> None:
    journal, daemon = Journal(), Daemon()
    work = Served(layout, daemon, journal)
    work.run(js_of())
    journal.add("a", SYSLOG_IDENTIFIER="app")
    saved = work.path.read_bytes()  # the state before "a" was made
    journal.add("b", SYSLOG_IDENTIFIER="app")
    work.run(js_of())
    work.path.write_bytes(saved)  # as if rq-scan died before writing the cursor
    Served(layout, daemon, journal).run(js_of())
    assert len(daemon.made) == 2
    assert (fires(layout)["made"], fires(layout)["duplicate"]) == (2, 2)


def test_a_burst_past_the_limit_is_folded_into_one_message_once_there_is_room(
        layout: Layout) -> None:
    # Given at most 2 messages in 60 s
    journal, daemon = Journal(), Daemon()
    work = Served(layout, daemon, journal)
    work.run(js_of(2, 60))
    # When 7 entries come at once
    for n in range(7):
        journal.add(f"e{n}", SYSLOG_IDENTIFIER="app")
    out = work.run(js_of(2, 60))
    # Then 2 are made, 5 folded, and the job is due again when the window has room
    assert [m["param1"] for m in daemon.made.values()] == ["e0", "e1"]
    assert out.wake_in is not None and 59 < out.wake_in <= 60
    assert json.loads(work.path.read_text())["fold"] == {"count": 5, "first": "c0002",
                                                         "last": "c0006"}
    # and once it has (a restart on the way: the fold is in the state file)
    work = Served(layout, daemon, journal)
    work._load(js_of(2, 60))
    work.window.sent = [t - 61 for t in work.window.sent]
    work.run(js_of(2, 60))
    folded = list(daemon.made.values())[-1]
    assert folded["param1"] == "folded 5 entries" and folded["attach"] == "folded.json"
    assert folded["body"] == {"folded": 5, "first_cursor": "c0002", "last_cursor": "c0006"}
    assert (fires(layout)["made"], fires(layout)["folded"]) == (3, 5)
    assert json.loads(work.path.read_text())["fold"] is None


def test_no_journal_readable_is_said_once_in_the_log_and_the_record(layout: Layout) -> None:
    work = Served(layout, Daemon(), Journal(), files=False)
    first, second = work.run(js_of()), work.run(js_of())
    assert [kind for kind, _text in first.lines] == ["err"]
    assert "no journal readable" in first.lines[0][1] and second.lines == []
    assert first.wake_in == journalwork.RETRY and first.fd is None
    assert fires(layout)["unreadable"] == 1
    assert "no journal readable" in fires(layout)["last_error"]


def test_a_queue_down_stops_at_its_entry_and_it_is_made_once_the_queue_is_back(
        layout: Layout) -> None:
    journal, daemon = Journal(), Daemon()
    work = Served(layout, daemon, journal)
    work.run(js_of())
    journal.add("a", SYSLOG_IDENTIFIER="app")
    journal.add("b", SYSLOG_IDENTIFIER="app")
    daemon.down = True
    down = [work.run(js_of()), work.run(js_of())]
    assert [d.wake_in for d in down] == [journalwork.RETRY] * 2
    assert fires(layout)["refused"] == 1  # counted once while it lasts
    daemon.down = False
    back = work.run(js_of())
    assert [m["param1"] for m in daemon.made.values()] == ["a", "b"]
    assert any("works again" in text for _kind, text in back.lines)


def test_a_real_reader_over_no_journal_files_is_no_journal_readable(layout: Layout,
                                                                    tmp_path: Path) -> None:
    from systemd import journal as sd_journal

    empty = tmp_path / "no-journal"
    empty.mkdir()
    work = Work(layout, "j", lambda terms: sd_journal.Reader(path=str(empty)))
    out = work.run(js_of())
    assert out.fd is None and "no journal readable" in out.lines[0][1]


def test_the_state_file_is_in_the_triggers_state_directory(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "root", tmp_path / "sock")
    work = Work(layout, "j")
    assert work.path == tmp_path / "root" / "triggers" / ".state" / "j.journal.json"
