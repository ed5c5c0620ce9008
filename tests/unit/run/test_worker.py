"""Unit tests of the exit rules (Worker.verdict) and fd 3 line reading."""

import os
import signal

import pytest

from rqsys.run.handoff import HandedChild
from rqsys.run.protocol import parse_line
from rqsys.run.spawn import Child, describe_exit
from rqsys.run.verdict import MAX_LINE, Worker

EXIT0, EXIT1 = 0, 1 << 8
KILLED = signal.SIGKILL


def worker(last=None, count=0, pid=0, child=Child, **kw):
    r, w = os.pipe()
    os.close(w)
    wk = Worker("20240101.0000.00.000.0", {"count": count}, child(pid, r, r, r, closed={r}),
                **kw)
    os.close(r)
    wk.terminal = parse_line(last) if last else None
    return wk


@pytest.mark.parametrize(("last", "status", "state"), [
    (b"done ok", EXIT0, "done"), (b"done ok", EXIT1, "err"), (b"err no", EXIT0, "err"),
    (b"err no", EXIT1, "err"), (None, EXIT0, "err"), (None, EXIT1, "err"),
    (b"relayed http://x/q/a/1", EXIT0, "relayed"), (b"resend 5-later", EXIT0, "que"),
    (b"resend 5-later", EXIT1, "err"), (b"done ok", KILLED, "err"),
])
def test_verdicts(last, status, state):
    assert worker(last).verdict(status, 15).state == state


def test_resend_delay_and_limit_count_as_rq():
    # RQ's count is the resends so far; a resend raises it, and reaching max_count is err
    out = worker(b"resend 7-x", count=3).verdict(0, 5)
    assert (out.state, out.delay, out.recount) == ("que", 7, 1)
    out = worker(b"resend 7-x", count=4).verdict(0, 5)
    assert (out.state, out.text, out.recount) == \
        ("err", "HIT MAX RESEND COUNT - MOVING TO ERR - x", 1)
    assert worker(b"done x", count=4).verdict(0, 5).recount == 0


@pytest.mark.parametrize(("last", "status", "text"), [
    (b"done sneaky", EXIT1, "Completion was done but exit status was pid 4242 exit 1"),
    (b"resend 5-x", 3 << 8, "Completion was resend but exit status was pid 4242 exit 3"),
    (b"relayed http://x/q/a/1", EXIT1, "Completion was relayed but exit status was pid 4242"),
    (None, EXIT1, "Completion was  but exit status was pid 4242 exit 1"),
    (None, signal.SIGTERM,
     "Completion was  but exit status was pid 4242 SIGTERM (signal 15)"),
])
def test_improper_exit_is_rqs_text(last, status, text):
    out = worker(last, pid=4242).verdict(status, 15)
    assert out.state == "err"
    assert out.text.startswith("PROCESS EXITED IMPROPERLY - MOVING TO ERR - ")
    assert text in out.text


def test_improper_exit_of_a_handed_relay_names_the_relay_worker():
    out = worker(b"relayed http://x/q/a/1", child=HandedChild).verdict(3 << 8, 15)
    assert out.text.endswith("Completion was relayed but exit status was relay worker exit 3")


def test_err_is_err_whatever_the_exit():
    assert worker(b"err by design").verdict(EXIT1, 15).text == "by design"
    assert describe_exit(EXIT1) == "exit status 1"


def test_destroy_and_stop_override_everything():
    assert worker(b"done", stop_reason="destroy").verdict(0, 15).state == "deleted"
    assert worker(b"done", stop_reason="stopping").verdict(KILLED, 15).state == "que"


def test_line_feeding_across_chunks_and_overlong_lines():
    wk = worker()
    assert wk._feed(b"run a") == []
    got = wk._feed(b"bc\ndone x\n")
    assert [c.text for c in got] == ["abc", "x"]
    got = wk._feed(b"run " + b"z" * (MAX_LINE * 2) + b"\ndone y\n")
    assert got[0].kind == "run" and "was cut" in str(got[1]) and got[2].text == "y"


def test_dup_answers_are_written_in_the_order_the_script_asked():
    wk = worker()
    first, second, third = wk.expect_reply(), wk.expect_reply(), wk.expect_reply()
    # The second answer comes first (a fast peer): it waits for the first
    second.append("ok http://h/q/b/2\n")
    assert wk.ready_replies() == []
    first.append("fail queue a: timed out\n")
    assert wk.ready_replies() == ["fail queue a: timed out\n", "ok http://h/q/b/2\n"]
    third.append("ok http://h/q/c/3\n")
    assert wk.ready_replies() == ["ok http://h/q/c/3\n"] and wk.ready_replies() == []


@pytest.mark.parametrize(("last", "state", "text"), [
    (b"done fine", "done", "fine"), (b"err broken", "err", "broken"),
    (b"resend 5-later", "que", "later"),
    (None, "err", "pid 42 ended without sending done; its exit status was lost"),
])
def test_a_script_whose_exit_status_was_lost_ends_as_its_lines_say(last, state, text):
    wk = worker(last, pid=42)
    wk.child.status_lost = True
    got = wk.verdict(wk.child.wait()[1], 15)
    assert got.state == state and got.text.startswith(text)
