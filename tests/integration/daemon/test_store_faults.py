"""Faults of the disk and of the store's files, under a real daemon: each is
that message's trouble, or a clear error to the client, never the end of the
daemon (a review found both below ending it)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

from conftest import need, wait_for
from daemon_util import failing_calls, send, settle, store_of

from rqsys.errors import StoreError


def test_a_run_directory_without_its_msg_goes_to_err_and_the_queue_starts(layout, make_queue,
                                                                       daemon):
    # Given a run/ directory whose msg is gone (e2fsck after a power cut, an operator)
    make_queue("q", 'echo "done fine" >&3\n')
    daemon("q").stop()
    lost = store_of(layout, "q").msg_dir("run", "20261124.1200.00.000.0")
    (lost / "job").mkdir(parents=True)
    (lost / "status").write_text("running")
    # When the daemon starts (it exited 1 at every start: "no message ... in q/run")
    proc = daemon("q")
    # Then that message is in err (once que/ is read: rqsys.daemon.queload), saying
    # why, and the queue runs
    wait_for(lambda: store_of(layout, "q").find(lost.name) == "err", 10, "it in err")
    wait_for(lambda: f"{lost.name}: err: unreadable" in proc.stderr_text(), 10, "the reason")
    assert settle(proc, send(proc))["state"] == "done"


def test_a_failing_syncfs_fails_its_creates_and_the_daemon_lives_on(layout, make_queue, daemon):
    make_queue("q", 'echo "done fine" >&3\n')
    proc = daemon("q")
    proc.call("adminoper", oper="pause")
    # Given a disk whose syncfs fails (a writeback error of any file on it: EIO)
    with failing_calls(proc.proc.pid, "syncfs", "error=EIO"):
        # When two messages are created in one group commit (its durability is one syncfs)
        results = proc.call("create_many", msgs=[{"param1": "a"}, {"param1": "b"}])["results"]
        # Then each is refused with the reason, and none is stored
        assert [r.get("kind") for r in results] == [StoreError.__name__] * 2, results
        assert "Input/output error" in results[0]["error"], results
    assert proc.call("counts")["counts"]["que"] == 0
    # And the daemon lives on: once the disk syncs again, they are stored
    results = proc.call("create_many", msgs=[{"param1": "a"}, {"param1": "b"}])["results"]
    assert all("msg_id" in r for r in results), results
    assert proc.call("counts")["counts"]["que"] == 2




def test_a_leftover_a_script_made_read_only_does_not_stop_the_start(layout, make_queue):
    need(shutil.which("setpriv") is not None, "setpriv (Debian util-linux)")
    # Given a deleted message's leftover in .tmp/ with a directory its script made
    # read-only (Go's module cache is 0555)
    make_queue("q", 'echo "done" >&3\n')
    leftover = layout.queue_dir("q") / ".tmp" / "deleted.20261124.1609.46.585.0.1"
    pkg = leftover / "job" / "gomod" / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "file.go").write_text("package x\n")
    pkg.chmod(0o555)
    # When recovery runs as a daemon does under its unit (user rq: without
    # CAP_DAC_OVERRIDE; every start failed with PermissionError)
    got = subprocess.run(
        ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner", sys.executable,
         "-c", "import sys, pathlib; from rqsys.store import QueueStore; "
         "QueueStore(pathlib.Path(sys.argv[1])).recover()", str(layout.queue_dir("q"))],
        capture_output=True, text=True, timeout=60)
    # Then it succeeds, and the leftover is gone
    assert got.returncode == 0, got.stderr
    assert not leftover.exists()


def test_a_message_directory_removed_by_hand_is_dropped_and_the_daemon_lives_on(
        layout, make_queue, daemon, tmp_path):
    gate = tmp_path / "gate"
    make_queue("q", f'[ "$RQ_PARAM1" = wait ] && while [ ! -e {gate} ]; do sleep 0.05; done\n'
                    'echo "done $RQ_PARAM1" >&3\n')
    proc = daemon("q")
    store = store_of(layout, "q")
    proc.call("adminoper", oper="pause")
    # Given a queued message whose directory an operator removed (rm -rf que/<id>)
    removed = send(proc, param1="removed")
    kept = send(proc, param1="kept")
    shutil.rmtree(store.msg_dir("que", removed))
    # When it comes due (this ended the daemon: "no message ... in q/que")
    proc.call("adminoper", oper="up")
    # Then it is dropped, saying so, and the next one runs
    assert settle(proc, kept)["status"] == "kept"
    wait_for(lambda: f"{removed}: deleted: gone from que/" in proc.stderr_text(), 10, "the log")
    # Given a running message whose directory is removed (rm -rf run/<id>)
    running = send(proc, param1="wait")
    wait_for(lambda: f"{running}: started: pid" in proc.stderr_text(), 10, "it running")
    shutil.rmtree(store.msg_dir("run", running))
    # When its script ends (this ended the daemon too), Then it is dropped, and
    # the queue goes on
    gate.touch()
    wait_for(lambda: f"{running}: deleted: gone from run/" in proc.stderr_text(), 10, "the log")
    assert settle(proc, send(proc, param1="after"))["status"] == "after"
    assert proc.proc.poll() is None


def test_new_messages_a_full_disk_kept_out_of_que_are_placed_once_it_lets(layout, make_queue,
                                                                          daemon):
    make_queue("q", 'echo "done $RQ_PARAM1" >&3\n')
    proc = daemon("q")
    proc.call("adminoper", oper="pause")
    # Given a disk that refuses the third rename on (que/ needs a new block: ENOSPC)
    with failing_calls(proc.proc.pid, "rename", "error=ENOSPC:when=3+"):
        # When five are created in one group commit: durable, then renamed into que/
        results = proc.call("create_many", msgs=[{"param1": f"m{n}"} for n in range(5)])
        ids = [got["msg_id"] for got in results["results"]]
        # Then all five are answered (durable in .tmp/: a client's retry would make
        # them twice), the two renamed are queued, and the log says why the rest wait
        assert len(ids) == 5
        assert proc.call("counts")["counts"]["que"] == 2  # (they were not: stuck till restart)
        wait_for(lambda: "new messages not yet in que/" in proc.stderr_text(), 10, "the log")
    # And once the disk takes them, the rest are placed, and all run
    wait_for(lambda: proc.call("counts")["counts"]["que"] == 5, 10, "the rest placed")
    proc.call("adminoper", oper="up")
    assert [settle(proc, msg_id)["status"] for msg_id in ids] == [f"m{n}" for n in range(5)]
    assert "new messages placed again" in proc.stderr_text()


def test_a_removed_message_parked_behind_a_key_does_not_hold_the_others(
        layout, make_queue, daemon, tmp_path):
    gate = tmp_path / "gate"
    make_queue("q", f'[ "$RQ_PARAM2" = wait ] && while [ ! -e {gate} ]; do sleep 0.05; done\n'
                    'echo "done $RQ_PARAM2" >&3\n', num_workers=3, blocking_params=[1])
    proc = daemon("q")
    # Given a running message of a key, and two parked behind it (one at a time a key)
    first = send(proc, param1="k", param2="wait")
    wait_for(lambda: proc.call("status", msg_id=first)["state"] == "run", 10, "it running")
    removed, last = send(proc, param1="k", param2="b"), send(proc, param1="k", param2="c")
    # When the next one's directory is removed by hand and the first ends
    shutil.rmtree(store_of(layout, "q").msg_dir("que", removed))
    gate.touch()
    # Then the last one runs all the same (it stayed parked: the wake went to the gone one)
    assert settle(proc, last)["status"] == "c"
    wait_for(lambda: f"{removed}: deleted: gone from que/" in proc.stderr_text(), 10, "the log")


def test_an_idle_daemon_holding_unplaced_messages_does_not_exit(layout, make_queue, daemon):
    make_queue("q", 'echo "done $RQ_PARAM1" >&3\n', idle_timeout=1)
    proc = daemon("q")
    # Given a disk that refuses every rename into que/, and a daemon that exits when idle
    with failing_calls(proc.proc.pid, "rename", "error=ENOSPC"):
        # When a message is created (answered ok: durable in .tmp/), and it stays there
        msg_id = proc.call("create", msg={"param1": "kept"})["msg_id"]
        time.sleep(3)
        # Then the daemon has not exited as idle (it left it invisible till the next start)
        assert proc.proc.poll() is None
    wait_for(lambda: "new messages placed again" in proc.stderr_text(), 10, "it placed")
    assert settle(proc, msg_id)["status"] == "kept"
