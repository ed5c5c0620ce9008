"""The daemons' EventLog: which sinks hear which events, and its journal entries."""

from __future__ import annotations

from typing import Any

from rqsys.observe.events import EventLog, listening


def test_sinks_hear_only_the_kinds_they_listen_to() -> None:
    log = EventLog("q", journal=False)
    heard: dict[str, list[str]] = {"all": [], "ends": [], "late": [], "later": []}
    log.sinks.append(lambda kind, *_: heard["all"].append(kind))

    @listening("done", "err")
    def ends(kind: str, *_: Any) -> None:
        heard["ends"].append(kind)

    log.sinks.append(ends)
    for kind in ("started", "status", "done"):
        log.record(kind, "m1")
    log.sinks.append(lambda kind, *_: heard["late"].append(kind))  # routes made again
    log.record("err", "m1")
    log.sinks += [lambda kind, *_: heard["later"].append(kind)]
    log.record("err", "m1")
    assert heard == {"all": ["started", "status", "done", "err", "err"],
                     "ends": ["done", "err", "err"], "late": ["err", "err"], "later": ["err"]}


def test_journal_entries_name_their_code_without_a_stack_walk() -> None:
    """journal.send walks the stack for CODE_* unless given them: given here,
    with what the walk would find (this module's ``event``)."""
    log = EventLog("q", journal=False)
    sent: list[tuple[str, dict[str, Any]]] = []
    log._send = lambda line, **fields: sent.append((line, fields))
    log.event("done", "ok", "m1", RQ_COUNT=0)
    line, fields = sent[0]
    assert line == "q: m1: done: ok"
    assert fields["CODE_FUNC"] == "event"
    assert fields["CODE_FILE"].endswith("rqsys/observe/events.py")
    assert isinstance(fields["CODE_LINE"], int)
    assert fields["RQ_MSG_ID"] == "m1" and fields["RQ_COUNT"] == "0"


def test_a_move_without_an_event_takes_a_timelines_pending_lines_along(tmp_path) -> None:
    from rqsys.observe.timeline import Timeline

    # Given a message retried into que/ whose line waits for the turn's flush
    for state in ("que", "run"):
        (tmp_path / state / "m1").mkdir(parents=True)
    timeline = Timeline(lambda state, msg_id: str(tmp_path / state / msg_id), host="h")
    log = EventLog("q", journal=False)
    log.sinks.append(timeline)
    log.record("retried", "m1", "err → que", RQ_STATE="que")
    # When it moves to run/ in the same turn (a start the fork server has not answered)
    (tmp_path / "que" / "m1").rmdir()
    log.moved("m1", "run")
    timeline.flush()
    # Then its line is written where it is now, none lost
    assert '"ev":"retried"' in (tmp_path / "run" / "m1" / "timeline").read_text()
    assert timeline.failed == 0
