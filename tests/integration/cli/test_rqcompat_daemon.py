"""RQ's queue-daemon behaviour through real daemons and scripts (issue 13):
RQ_COUNT and count, coalescing (done and failed primaries), RQ's admin
files config/<q>.down|.pause beside adminoper, dups to a URL through the
relay queue, and RQ's texts on fd 4."""

from __future__ import annotations

import time

import pytest
from conftest import wait_for
from daemon_util import job_file, send, settle

from rqsys.errors import QueueDown

HOUR = 3600


def runlog_queue(make_queue, tmp_path, body, name="q", **cfg):
    """A queue whose script logs "<id> <param1> <RQ_COUNT>" to runs.log, then runs ``body``."""
    runlog = tmp_path / f"{name}-runs.log"
    make_queue(name, f'echo "$RQ_MSG_ID $RQ_PARAM1 $RQ_COUNT" >> "$RUNLOG"\n{body}',
               env_vars={"RUNLOG": str(runlog)}, **cfg)
    return runlog


def runs(runlog):
    return [line.split() for line in runlog.read_text().splitlines()] if runlog.exists() else []


# ---------------------------------------------------------------- RQ_COUNT and count
def test_rq_count_is_0_then_1_then_2_across_resends(make_queue, daemon, layout):
    # Given RQ's test script's shape: resend while RQ_COUNT < 2
    make_queue("q", """
        echo "count=$RQ_COUNT" >> counts.txt
        if [ "$RQ_COUNT" -lt 2 ]; then echo "resend 0-again" >&3; exit 0; fi
        echo "done after $RQ_COUNT resends" >&3
    """)
    proc = daemon("q")
    msg_id = send(proc)
    reply = settle(proc, msg_id)
    # Then each run saw RQ's count, and the message keeps it (statuscountmesg's number)
    assert reply == {"ok": True, "state": "done", "status": "after 2 resends"}
    assert job_file(layout, "q", msg_id, "counts.txt").read_text().split() == \
        ["count=0", "count=1", "count=2"]
    assert proc.call("get", msg_id=msg_id)["msg"]["count"] == 2


def test_a_message_run_once_has_count_0_and_a_count_sent_is_kept(make_queue, daemon,
                                                                     tmp_path):
    runlog = runlog_queue(make_queue, tmp_path, 'echo "done ok" >&3')
    proc = daemon("q")
    once, sent = send(proc, param1="once"), send(proc, param1="sent", count=5)
    for msg_id in (once, sent):
        settle(proc, msg_id)
    assert [r[1:] for r in runs(runlog)] == [["once", "0"], ["sent", "5"]]
    assert proc.call("get", msg_id=once)["msg"]["count"] == 0
    assert proc.call("get", msg_id=sent)["msg"]["count"] == 5


# ---------------------------------------------------------------- coalescing
def test_coalesced_dups_end_done_as_duplicates_whatever_their_due(make_queue, daemon,
                                                                   tmp_path):
    # Given (send_test_coalesce.sh) two messages due in an hour, then one due now
    runlog = runlog_queue(make_queue, tmp_path, 'echo "done done sleeping" >&3',
                          coalesce_params=[1])
    proc = daemon("q")
    later = [send(proc, param1="fast", due=time.time() + HOUR) for _ in range(2)]
    other = send(proc, param1="slow", due=time.time() + HOUR)
    now = send(proc, param1="fast")
    # Then the one due now runs, alone, and the two become its duplicates
    assert settle(proc, now)["status"] == "done sleeping"
    url = proc.call("get", msg_id=now)["url"]
    for dup in later:
        assert settle(proc, dup) == {"ok": True, "state": "done", "status": f"duplicate {url}"}
    assert [r[0] for r in runs(runlog)] == [now]
    # And a message with other params waits for its own time
    assert proc.call("state", msg_id=other)["state"] == "que"


def test_dups_of_a_failed_primary_go_back_to_que_and_run_on_their_own(make_queue, daemon,
                                                                       tmp_path):
    # Given two queued messages due in an hour and one due now whose script fails
    runlog = runlog_queue(make_queue, tmp_path, """
        if [ "$RQ_PARAM2" = err ]; then echo "err by design" >&3; exit 0; fi
        echo "done done sleeping" >&3
    """, coalesce_params=[1])
    proc = daemon("q")
    first, second = (send(proc, param1="fast", due=time.time() + HOUR) for _ in range(2))
    failing = send(proc, param1="fast", param2="err")
    assert settle(proc, failing)["status"] == "by design"
    # Then they are queued again, each at its own due time, as if nothing happened
    listed = proc.call("list", state="que")["ids"]
    assert first in listed and second in listed
    assert proc.call("state", msg_id=first)["state"] == "que"
    # And when one of them runs, the other becomes its duplicate
    proc.call("run_now", msg_id=first)
    url = proc.call("get", msg_id=first)["url"]
    assert settle(proc, first)["status"] == "done sleeping"
    assert settle(proc, second)["status"] == f"duplicate {url}"
    assert [r[0] for r in runs(runlog)] == [failing, first]


def test_dups_of_a_resent_primary_wait_again(make_queue, daemon, tmp_path):
    # Given (RQ's "resend coalesce") a primary that resends on its first run
    runlog = runlog_queue(make_queue, tmp_path, """
        if [ "$RQ_PARAM2" = resend1 ] && [ "$RQ_COUNT" = 0 ]; then
            echo "resend 3600-later" >&3; exit 0
        fi
        echo "done done sleeping" >&3
    """, coalesce_params=[1])
    proc = daemon("q")
    dup = send(proc, param1="fast", due=time.time() + HOUR)
    resending = send(proc, param1="fast", param2="resend1")
    wait_for(lambda: proc.call("state", msg_id=resending)["state"] == "que"
             and proc.call("status", msg_id=resending)["status"] == "later", what="the resend")
    # Then both wait; the next one that runs takes the other along
    assert proc.call("state", msg_id=dup)["state"] == "que"
    proc.call("run_now", msg_id=dup)
    url = proc.call("get", msg_id=dup)["url"]
    assert settle(proc, resending)["status"] == f"duplicate {url}"
    assert proc.call("get", msg_id=resending)["msg"]["count"] == 1
    assert [r[0] for r in runs(runlog)] == [resending, dup]


# ---------------------------------------------------------------- RQ's admin files
def admin_files(layout, name="q"):
    config = layout.config_file.parent
    return config / f"{name}.down", config / f"{name}.pause"


def test_down_file_makes_the_queue_down_and_back(make_queue, daemon, layout):
    make_queue("q", 'echo "done ok" >&3')
    proc = daemon("q")
    down, _pause = admin_files(layout)
    # When an operator touches config/q.down (test_run_admin_down.sh), the next
    # status request already says DOWN, and new messages are refused
    down.touch()
    counts = proc.call("counts")
    assert counts["admin"] == "DOWN" and counts["status"].startswith("DOWN")
    with pytest.raises(QueueDown):
        send(proc)
    # When it is removed, the queue is UP again
    down.unlink()
    assert proc.call("counts")["admin"] == "UP"
    assert settle(proc, send(proc))["state"] == "done"


def test_pause_file_holds_messages_and_its_removal_is_seen_without_asking(make_queue, daemon,
                                                                          layout, tmp_path):
    runlog = runlog_queue(make_queue, tmp_path, 'echo "done done sleeping" >&3')
    proc = daemon("q")
    _down, pause = admin_files(layout)
    pause.touch()
    assert proc.call("counts")["admin"] == "PAUSE"
    # Given two messages due now sent while paused (test_run_admin_pause.sh)
    ids = [send(proc, param1="fast", due=time.time() - 2) for _ in range(2)]
    counts = proc.call("counts")["counts"]
    assert (counts["que"], counts["run"]) == (2, 0) and runs(runlog) == []
    # When the file goes, inotify wakes the daemon (it would otherwise sleep
    # up to a minute): both run, and only "status" is asked meanwhile
    pause.unlink()
    for msg_id in ids:
        assert settle(proc, msg_id, timeout=10)["status"] == "done sleeping"
    assert proc.call("counts")["admin"] == "UP"


def test_a_pause_file_appearing_is_seen_by_the_watch(make_queue, daemon, layout, tmp_path):
    runlog = runlog_queue(make_queue, tmp_path, 'echo "done ok" >&3')
    proc = daemon("q")
    _down, pause = admin_files(layout)
    pause.touch()
    # Without any status request, the daemon learns of the file from inotify
    assert notified(proc, "STATUS=PAUSE: ")
    msg_id = send(proc, due=time.time() - 1)
    assert proc.call("state", msg_id=msg_id)["state"] == "que" and runs(runlog) == []


def notified(proc, prefix, timeout=10.0):
    """The first line the daemon sends to systemd that starts with ``prefix``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for msg in proc.messages:
            found = [line for line in msg.split("\n") if line.startswith(prefix)]
            if found:
                return found[0]
        try:
            proc.messages.append(proc.notify.recv(4096).decode())
        except TimeoutError:
            pass
    raise AssertionError(f"no {prefix!r} line from {proc.name} within {timeout}s")


def test_admin_files_and_adminoper_combine_to_the_stricter(make_queue, daemon, layout):
    make_queue("q", 'echo "done ok" >&3')
    proc = daemon("q")
    down, pause = admin_files(layout)
    # rqsys's own state PAUSE, RQ's file DOWN: DOWN
    assert proc.call("adminoper", oper="pause")["admin"] == "PAUSE"
    down.touch()
    assert proc.call("counts")["admin"] == "DOWN"
    # rq adminoper up removes config/q.down as RQ's does; still PAUSE by rqsys's own
    assert proc.call("adminoper", oper="up")["admin"] == "UP"
    assert not down.exists()
    pause.touch()
    assert proc.call("counts")["admin"] == "PAUSE"
    # resume removes config/q.pause
    assert proc.call("adminoper", oper="resume")["admin"] == "UP"
    assert not pause.exists() and proc.call("counts")["admin"] == "UP"


def test_admin_files_are_read_at_start(make_queue, daemon, layout):
    make_queue("q", 'echo "done ok" >&3')
    down, _pause = admin_files(layout)
    down.touch()
    proc = daemon("q")
    assert proc.call("config")["admin"] == "DOWN"


# ---------------------------------------------------------------- dups
DUPPER = 'echo "dup 0-X-$RQ_PARAM1" >&3; read -r answer <&4; echo "done $answer" >&3'


def test_a_dup_to_this_hosts_url_goes_through_the_relay_queue(make_queue, daemon, layout):
    # Given queue q, a queue "other", and a relay queue that only records
    make_queue("q", DUPPER)
    make_queue("other", 'echo "done other ran it" >&3')
    make_queue("relay", 'echo "$RQ_DEST_QUEUE" > seen; echo "done held" >&3')
    proc, other, relay = daemon("q"), daemon("other"), daemon("relay")
    other_url = other.call("get", msg_id=send(other))["url"].rsplit("/", 1)[0]
    # When q's script dups its message to other's URL, on this very host
    msg_id = send(proc, param1=other_url)
    answer = settle(proc, msg_id)["status"]
    # Then (RQ: every http: dest) the copy went to the relay queue, dest the URL
    assert answer.startswith("ok ") and "/q/relay/" in answer, answer
    copy_id = answer.rsplit("/", 1)[1]
    assert settle(relay, copy_id)["status"] == "held"
    assert relay.call("get", msg_id=copy_id)["msg"]["dest"] == other_url


def test_a_dup_to_a_queue_that_does_not_exist_gets_rqs_text(make_queue, daemon):
    make_queue("q", DUPPER)
    proc = daemon("q")
    reply = settle(proc, send(proc, param1="nope_this_q_does_not_exist"))
    assert reply["status"] == "fail couldn't connect to queue - nope_this_q_does_not_exist"
