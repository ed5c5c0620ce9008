"""Crashes and stops of the queue daemon: nothing acknowledged is ever lost."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap

from conftest import wait_for
from daemon_util import send, settle, store_of, stray_temps

from rqsys.store import STATES
from rqsys.store.layout import arrival

WAIT_FOR_GATE = """
    trap 'echo term > "$MARKS/$RQ_MSG_ID.term"; exit 143' TERM
    echo "run started $RQ_COUNT" >&3
    while [ ! -e "$MARKS/gate" ]; do sleep 0.02; done
    echo "done finished" >&3
"""


def _where(layout, msg_id):
    store = store_of(layout, "q")
    return [s for s in STATES if store.msg_dir(s, msg_id).is_dir()]


def test_sigkill_while_scripts_run_loses_nothing(layout, make_queue, daemon, tmp_path):
    # Given three scripts running and three messages waiting
    marks = tmp_path / "marks"
    marks.mkdir()
    make_queue("q", WAIT_FOR_GATE, num_workers=3, env_vars={"MARKS": str(marks)})
    proc = daemon("q")
    ids = [send(proc) for _ in range(6)]
    wait_for(lambda: _started(proc, ids) == 3, what="three scripts running, their TERM trap set")
    running = [i for i in ids if proc.call("state", msg_id=i)["state"] == "run"]
    # When the daemon is killed outright
    proc.kill(signal.SIGKILL)
    proc.proc.wait(10)
    # Then the running scripts got SIGTERM from the parent-death signal
    wait_for(lambda: all((marks / f"{i}.term").exists() for i in running),
             what="scripts told TERM by pdeathsig")
    # And after a restart every message is in exactly one place and all finish
    proc = daemon("q")
    assert all(len(_where(layout, i)) == 1 for i in ids)
    (marks / "gate").write_text("")
    for msg_id in ids:
        assert settle(proc, msg_id)["state"] == "done"
    assert proc.call("counts")["counts"]["done"] == 6


ENQUEUER = textwrap.dedent("""
    import sys
    from rqsys.wire.client import QueueClient
    from rqsys.store import Layout
    layout = Layout.from_root(sys.argv[1])
    with QueueClient(layout, "q") as client:
        for n in range(int(sys.argv[2])):
            try:
                reply = client.call("create", msg={"param1": str(n)})
            except Exception as exc:
                print("fail", exc, flush=True)
                break
            print(reply["msg_id"], flush=True)
""")


def test_sigkill_during_concurrent_enqueues(layout, make_queue, daemon, tmp_path):
    # Given a paused queue and four clients sending 250 messages each
    make_queue("q", "echo done >&3")
    proc = daemon("q")
    proc.call("adminoper", oper="pause")
    script = tmp_path / "enqueue.py"
    script.write_text(ENQUEUER)
    clients = [subprocess.Popen([sys.executable, str(script), str(layout.root), "250"],
                                stdout=subprocess.PIPE, text=True) for _ in range(4)]
    first = clients[0].stdout.readline()
    # When the daemon is killed while they are sending
    proc.kill(signal.SIGKILL)
    proc.proc.wait(10)
    acked = [first.strip()]
    for client in clients:
        out, _ = client.communicate(timeout=30)
        acked += [line for line in out.splitlines() if not line.startswith("fail")]
    acked = [a for a in acked if a]
    # Then the daemon restarts with every acknowledged message queued and
    # parsing (the move into que/ is not synced before the answer: recovery
    # finishes any move a crash cut short), temp files gone
    proc = daemon("q")
    store = store_of(layout, "q")
    for msg_id in acked:
        msg = json.loads((store.msg_dir("que", msg_id) / "msg").read_text())
        assert msg["msg_id"] == msg_id and msg["dest"] == "q"
    assert proc.call("counts")["counts"]["que"] >= len(acked)
    assert stray_temps(layout) == []
    assert len(acked) < 1000, "the kill came too late to test anything"


def test_sigterm_requeues_running_then_done_after_restart(layout, make_queue, daemon, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    make_queue("q", WAIT_FOR_GATE, num_workers=2, env_vars={"MARKS": str(marks)})
    proc = daemon("q")
    ids = [send(proc) for _ in range(3)]
    wait_for(lambda: _started(proc, ids) == 2, what="two scripts running, their TERM trap set")
    # When the daemon is told to stop
    assert proc.stop() == 0
    # Then the running scripts were told TERM and their messages went back to que
    assert len(list(marks.glob("*.term"))) == 2
    store = store_of(layout, "q")
    assert sorted(store.ids("que")) == sorted(ids)
    assert all("requeued" in store.read_status("que", i) for i in ids[:2])
    # And after a restart they run to done
    (marks / "gate").write_text("")
    proc = daemon("q")
    for msg_id in ids:
        assert settle(proc, msg_id)["state"] == "done"


def _started(proc, ids):
    """How many of the messages' scripts have said "run started" (after their trap)."""
    return sum(proc.call("get", msg_id=i)["status"].startswith("started") for i in ids)


def _fill_que(layout, n):
    store = store_of(layout, "q")
    batch = [store.stage({"dest": "q", "param1": str(i), "count": 0, "due": 0})
             for i in range(n)]
    store.publish(batch)
    store.place(batch, "que")
    return [s.msg_id for s in batch]


def test_clean_stop_snapshot_speeds_the_next_start(layout, make_queue, daemon):
    # Given a paused queue with 1,200 queued messages, stopped cleanly
    make_queue("q", 'echo "done $RQ_PARAM1" >&3')
    store_of(layout, "q").set_admin_state("PAUSE")
    ids = _fill_que(layout, 1200)
    proc = daemon("q")
    _all_read(proc, 1200)  # a stop while que/ is still being read writes none (as a crash)
    assert proc.stop() == 0
    snapshot = layout.queue_dir("q") / "que.snapshot"
    assert snapshot.is_file()
    # When it starts again
    proc = daemon("q")
    # Then it loaded every message from the snapshot, which is gone now
    assert not snapshot.exists()
    assert proc.call("counts")["counts"]["que"] == 1200
    _all_read(proc, 1200)
    assert proc.call("list", state="que", limit=1000)["ids"] == sorted(ids, key=arrival)[:1000]
    assert proc.call("get", msg_id=ids[-1])["msg"]["param1"] == "1199"
    # (not run here: 1,200 runs would fill the fixture's unread stderr pipe)


def _all_read(proc, n):
    """Wait until the daemon has read all ``n`` of que/ (``rqsys.daemon.queload``)."""
    wait_for(lambda: proc.call("list", state="que", offset=n - 1, limit=1)["ids"], 30,
             "que/ read into memory")


def test_snapshot_not_matching_que_is_ignored(layout, make_queue, daemon):
    make_queue("q", "echo done >&3")
    store_of(layout, "q").set_admin_state("PAUSE")
    ids = _fill_que(layout, 1100)
    first = daemon("q")
    _all_read(first, 1100)
    first.stop()
    assert (layout.queue_dir("q") / "que.snapshot").exists()
    # While stopped, a message disappears and another one appears
    store = store_of(layout, "q")
    store.delete(ids[0], "que")
    extra = store.create({"dest": "q", "param1": "new", "count": 0, "due": 0})
    proc = daemon("q")
    assert proc.call("counts")["counts"]["que"] == 1100
    assert proc.call("get", msg_id=extra)["msg"]["param1"] == "new"
    assert not (layout.queue_dir("q") / "que.snapshot").exists()


def test_a_message_that_crashes_its_daemon_still_counts_its_runs(layout, make_queue, daemon,
                                                                    tmp_path):
    # Given a script that SIGKILLs its own daemon on its first two runs
    make_queue("q", """
        echo "$RQ_COUNT" >> "$MARKS/counts"
        if [ "$RQ_COUNT" -lt 2 ]; then kill -9 "$PPID"; sleep 5; fi
        echo "done third time lucky" >&3
    """, env_vars={"MARKS": str(tmp_path)})
    proc = daemon("q")
    msg_id = send(proc)
    # When the daemon is restarted after each crash
    for _ in range(2):
        proc.proc.wait(10)
        proc = daemon("q")
    # Then each run saw a higher RQ_COUNT, and the message ends with count 3
    wait_for(lambda: proc.call("state", msg_id=msg_id)["state"] == "done", what="done")
    assert (tmp_path / "counts").read_text().split() == ["0", "1", "2"]
    assert proc.call("get", msg_id=msg_id)["msg"]["count"] == 2
