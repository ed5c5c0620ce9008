"""Queue daemon operations and scheduling through a real daemon: coalesce,
blocking, admin states, SCRIPTERROR, dup, destroy, delete, clone, run_now,
commit, attach, list and counts."""

from __future__ import annotations

import hashlib
import os
import time

import pytest
from conftest import wait_for
from daemon_util import job_file, pid_alive, send, settle, store_of

from rqsys.errors import BadRequest, NotFound, QueueDown

GATED = 'while [ ! -e "$GATE" ]; do sleep 0.02; done; echo "done $RQ_PARAM1" >&3'


def _runlog_queue(make_queue, tmp_path, body, **cfg):
    runlog = tmp_path / "runs.log"
    env = {"RUNLOG": str(runlog), "GATE": str(tmp_path / "gate")}
    make_queue("q", f'echo "$RQ_MSG_ID $RQ_PARAM1" >> "$RUNLOG"\n{body}', env_vars=env, **cfg)
    return runlog


def test_coalesce_params(layout, make_queue, daemon, tmp_path):
    # Given a paused queue holding three messages with param1=x and one with y
    runlog = _runlog_queue(make_queue, tmp_path, 'echo "done ran" >&3', coalesce_params=[1])
    proc = daemon("q")
    proc.call("adminoper", oper="pause")
    xs = [send(proc, param1="x") for _ in range(3)]
    y = send(proc, param1="y")
    # When the queue resumes
    proc.call("adminoper", oper="resume")
    # Then x runs once and its copies end with it; y runs on its own
    for msg_id in [*xs, y]:
        assert settle(proc, msg_id)["state"] == "done"
    runs = runlog.read_text().split()
    assert runs == [xs[0], "x", y, "y"]
    url = proc.call("get", msg_id=xs[0])["url"]
    for dup in xs[1:]:
        assert proc.call("status", msg_id=dup)["status"] == f"duplicate {url}"  # RQ's text


def test_blocking_params(layout, make_queue, daemon, tmp_path):
    # Given 4 workers and a script that detects overlapping runs of one param1
    locks = tmp_path / "locks"
    locks.mkdir()
    body = f"""mkdir "{locks}/$RQ_PARAM1" || echo overlap >> "{tmp_path}/overlaps"
        {GATED}
        rmdir "{locks}/$RQ_PARAM1" """
    _runlog_queue(make_queue, tmp_path, body, num_workers=4, blocking_params=[1])
    proc = daemon("q")
    ids = [send(proc, param1=p) for p in ("a", "a", "a", "b")]
    # Then a and b run side by side, but never two a's
    wait_for(lambda: proc.call("counts")["counts"]["run"] == 2, what="a and b running")
    assert proc.call("state", msg_id=ids[1])["state"] == "que"
    (tmp_path / "gate").write_text("")
    for msg_id in ids:
        assert settle(proc, msg_id)["state"] == "done"
    assert not (tmp_path / "overlaps").exists()


def test_pause_accepts_but_does_not_run_across_restart(layout, make_queue, daemon, tmp_path):
    make_queue("q", 'echo "done ran" >&3')
    proc = daemon("q")
    assert proc.call("adminoper", oper="pause")["admin"] == "PAUSE"
    msg_id = send(proc)
    proc.stop()
    proc = daemon("q")
    counts = proc.call("counts")
    assert counts["admin"] == "PAUSE" and counts["status"].startswith("PAUSE")
    assert proc.call("state", msg_id=msg_id)["state"] == "que"
    proc.call("adminoper", oper="up")
    assert settle(proc, msg_id)["state"] == "done"


def test_down_refuses_new_messages_across_restart(layout, make_queue, daemon):
    make_queue("q", 'echo "done ran" >&3')
    proc = daemon("q")
    proc.call("adminoper", oper="down")
    with pytest.raises(QueueDown, match="DOWN"):
        send(proc)
    proc.stop()
    proc = daemon("q")
    with pytest.raises(QueueDown):
        send(proc)
    assert proc.call("counts")["counts"]["que"] == 0
    proc.call("adminoper", oper="up")
    assert settle(proc, send(proc))["state"] == "done"


def test_bad_admin_oper(make_queue, daemon):
    make_queue("q", "echo done >&3")
    proc = daemon("q")
    with pytest.raises(BadRequest, match="unknown admin operation"):
        proc.call("adminoper", oper="explode")
    assert proc.call("counts")["admin"] == "UP"


@pytest.mark.parametrize("breakage", ["not executable", "missing"])
def test_scripterror_keeps_messages_queued(layout, make_queue, daemon, breakage):
    entry = make_queue("q", 'echo "done fixed" >&3')
    run = entry / "run"
    saved = run.read_text()
    run.chmod(0o644) if breakage == "not executable" else run.unlink()
    proc = daemon("q")
    msg_id = send(proc)
    wait_for(lambda: proc.call("counts")["status"].startswith("SCRIPTERROR"),
             what="SCRIPTERROR status")
    assert proc.call("state", msg_id=msg_id)["state"] == "que"
    # When the script is fixed, the message runs (reload re-checks at once)
    run.write_text(saved)
    run.chmod(0o755)
    proc.call("reload")
    assert settle(proc, msg_id)["status"] == "fixed"
    assert not proc.call("counts")["status"].startswith("SCRIPTERROR")


DUPPER = """
    if [ -n "$RQ_ORIG_MSG_ID" ]; then echo "done copy" >&3; exit 0; fi
    echo "dup 0-x-$RQ_PARAM1" >&3
    read -r -u 4 answer
    echo "done $answer" >&3
"""


def _send_with_attachment(proc, tmp_path, **msg):
    data = tmp_path / "payload.bin"
    data.write_bytes(os.urandom(4096))
    msg_id = proc.call("create", msg=msg, state="prep")["msg_id"]
    with open(data, "rb") as f:
        _call_fds(proc, "attach", [f.fileno()], msg_id=msg_id, name="payload.bin",
                  md5=hashlib.md5(data.read_bytes()).hexdigest())
    proc.call("commit", msg_id=msg_id)
    return msg_id


def _call_fds(proc, op, fds, **args):
    with proc.client() as client:
        return client.call(op, fds=fds, **args)


def test_dup_to_other_queue_links_attachments(layout, make_queue, daemon, tmp_path):
    make_queue("q", DUPPER)
    make_queue("other", 'echo "done got $(ls ../attach)" >&3')
    proc, other = daemon("q"), daemon("other")
    msg_id = _send_with_attachment(proc, tmp_path, param1="other")
    status = settle(proc, msg_id)["status"]
    assert status.startswith("ok http://") and "/q/other/" in status
    copy_id = status.rsplit("/", 1)[1]
    assert settle(other, copy_id)["status"] == "got payload.bin"
    src = store_of(layout, "q").attachments("done", msg_id)[0]
    dst = store_of(layout, "other").attachments("done", copy_id)[0]
    assert os.stat(src).st_ino == os.stat(dst).st_ino
    got = other.call("get", msg_id=copy_id)
    assert got["msg"]["orig_msg_id"].endswith(f"/q/q/{msg_id}")
    assert got["attachments"]["payload.bin"]["md5"] == hashlib.md5(dst.read_bytes()).hexdigest()


def test_dup_to_same_queue(layout, make_queue, daemon):
    make_queue("q", DUPPER)
    proc = daemon("q")
    msg_id = send(proc, param1="q")
    status = settle(proc, msg_id)["status"]
    copy_id = status.rsplit("/", 1)[1]
    assert status.startswith("ok ") and copy_id != msg_id
    assert settle(proc, copy_id)["status"] == "copy"


@pytest.mark.parametrize("admin", ["none", "down", "pause"])
def test_dup_fail_is_answered_on_fd4(layout, make_queue, daemon, admin):
    make_queue("q", DUPPER)
    proc = daemon("q")
    if admin != "none":
        make_queue("other", "echo done >&3")
        daemon("other").call("adminoper", oper=admin)
    reply = settle(proc, send(proc, param1="other" if admin != "none" else "nosuch"))
    assert reply["state"] == "done"
    assert reply["status"].startswith("fail ")
    if admin != "none":
        assert admin.upper() in reply["status"]


def test_destroy_kills_the_whole_process_group(layout, make_queue, daemon):
    make_queue("q", """
        sleep 600 &
        echo $! > grandchild.pid
        echo $$ > script.pid
        echo "run waiting" >&3
        wait
    """)
    proc = daemon("q")
    msg_id = send(proc)
    wait_for(lambda: proc.call("status", msg_id=msg_id)["status"] == "waiting", what="running")
    pids = [int(job_file(layout, "q", msg_id, f).read_text()) for f in
            ("script.pid", "grandchild.pid")]
    assert all(pid_alive(p) for p in pids)
    assert proc.call("destroy", msg_id=msg_id)["killed"] is True
    wait_for(lambda: not any(pid_alive(p) for p in pids), what="script and grandchild gone")
    wait_for(lambda: _state_or_none(proc, msg_id) is None, what="message deleted")
    assert msg_id not in list(store_of(layout, "q").ids("run"))


def _state_or_none(proc, msg_id):
    try:
        return proc.call("state", msg_id=msg_id)["state"]
    except NotFound:
        return None


def test_delete(layout, make_queue, daemon):
    make_queue("q", "echo done >&3")
    proc = daemon("q")
    prep = proc.call("create", msg={}, state="prep")["msg_id"]
    done = send(proc)
    settle(proc, done)
    for msg_id in (prep, done):
        assert proc.call("delete", msg_id=msg_id) == {"ok": True}
        with pytest.raises(NotFound):
            proc.call("state", msg_id=msg_id)
    assert proc.call("counts")["counts"]["done"] == 0
    with pytest.raises(NotFound):
        proc.call("delete", msg_id=done)


def test_delete_running_is_refused(layout, make_queue, daemon, tmp_path):
    _runlog_queue(make_queue, tmp_path, GATED)
    proc = daemon("q")
    msg_id = send(proc)
    settle(proc, msg_id, ("run",))
    with pytest.raises(BadRequest, match="destroy"):
        proc.call("delete", msg_id=msg_id)
    (tmp_path / "gate").write_text("")
    assert settle(proc, msg_id)["state"] == "done"


def test_clone_links_attachments(layout, make_queue, daemon, tmp_path):
    make_queue("q", 'echo "done $RQ_PARAM1 $(cat ../attach/payload.bin | wc -c)" >&3')
    proc = daemon("q")
    msg_id = _send_with_attachment(proc, tmp_path, param1="p")
    settle(proc, msg_id)
    reply = proc.call("clone", msg_id=msg_id)
    clone_id = reply["msg_id"]
    assert clone_id != msg_id and reply["url"].endswith(clone_id)
    assert settle(proc, clone_id)["status"] == "p 4096"
    store = store_of(layout, "q")
    assert (os.stat(store.attachments("done", msg_id)[0]).st_ino
            == os.stat(store.attachments("done", clone_id)[0]).st_ino)
    assert proc.call("get", msg_id=clone_id)["msg"]["orig_msg_id"] == \
        proc.call("get", msg_id=msg_id)["url"]


def test_run_now(layout, make_queue, daemon):
    make_queue("q", 'echo "done ran" >&3')
    proc = daemon("q")
    msg_id = send(proc, due=time.time() + 3600)
    assert proc.call("state", msg_id=msg_id)["state"] == "que"
    proc.call("run_now", msg_id=msg_id)
    assert settle(proc, msg_id)["state"] == "done"
    with pytest.raises(BadRequest, match="not queued"):
        proc.call("run_now", msg_id=msg_id)


def test_commit_of_prep(layout, make_queue, daemon):
    make_queue("q", 'echo "done ran" >&3')
    proc = daemon("q")
    msg_id = proc.call("create", msg={"param1": "p"}, state="prep")["msg_id"]
    assert proc.call("counts")["counts"]["prep"] == 1
    assert proc.call("state", msg_id=msg_id)["state"] == "prep"
    assert proc.call("commit", msg_id=msg_id)["url"].endswith(msg_id)
    assert settle(proc, msg_id)["state"] == "done"
    assert proc.call("counts")["counts"]["prep"] == 0
    with pytest.raises(NotFound):
        proc.call("commit", msg_id="20200101.0000.00.000.0")


def test_attach_checks_md5(layout, make_queue, daemon, tmp_path):
    make_queue("q", "echo done >&3")
    proc = daemon("q")
    data = tmp_path / "f.txt"
    data.write_text("hello\n")
    msg_id = proc.call("create", msg={}, state="prep")["msg_id"]
    good = hashlib.md5(b"hello\n").hexdigest()
    with open(data, "rb") as f:
        with pytest.raises(BadRequest, match="md5"):
            _call_fds(proc, "attach", [f.fileno()], msg_id=msg_id, name="f.txt", md5="0" * 32)
        assert proc.call("get", msg_id=msg_id)["attachments"] == {}
        reply = _call_fds(proc, "attach", [f.fileno()], msg_id=msg_id, name="f.txt", md5=good)
    assert reply == {"ok": True, "md5": good, "size": 6, "name": "f.txt"}
    assert proc.call("get", msg_id=msg_id)["attachments"]["f.txt"]["md5"] == good


def test_create_with_attachments_checks_md5(layout, make_queue, daemon, tmp_path):
    make_queue("q", 'echo "done $(cat ../attach/a)" >&3')
    proc = daemon("q")
    data = tmp_path / "a"
    data.write_text("content")
    with open(data, "rb") as f:
        with pytest.raises(BadRequest, match="md5"):
            _call_fds(proc, "create", [f.fileno()], msg={},
                      attachments=[{"name": "a", "md5": "f" * 32}])
        reply = _call_fds(proc, "create", [f.fileno()], msg={}, attachments=[
            {"name": "a", "md5": hashlib.md5(b"content").hexdigest()}])
    assert settle(proc, reply["msg_id"])["status"] == "content"
    assert proc.call("counts")["counts"]["que"] == 0


def test_list_and_counts(layout, make_queue, daemon):
    make_queue("q", 'if [ "$RQ_PARAM1" = bad ]; then echo "err no" >&3; else echo done >&3; fi')
    proc = daemon("q")
    ids = [send(proc, param1=p) for p in ("ok", "bad", "ok", "ok")]
    for msg_id in ids:
        settle(proc, msg_id)
    counts = proc.call("counts")
    assert counts["counts"] == {"prep": 0, "que": 0, "run": 0, "done": 3, "err": 1,
                                "relayed": 0}
    assert counts["num_workers"] == 1 and counts["admin"] == "UP"
    listed = proc.call("list", state="done", offset=0, limit=2)
    assert listed == {"ok": True, "ids": [ids[3], ids[2]], "total": 3}
    assert proc.call("list", state="done", offset=2, limit=5)["ids"] == [ids[0]]
    assert proc.call("list", state="err")["ids"] == [ids[1]]
    with pytest.raises(BadRequest):
        proc.call("list", state="nosuch")
    with pytest.raises(BadRequest):
        proc.call("list", state="done", offset=-1)


def test_scripterror_clears_by_itself_once_fixed(layout, make_queue, daemon):
    entry = make_queue("q", 'echo "done fixed" >&3')
    (entry / "run").chmod(0o644)
    proc = daemon("q")
    msg_id = send(proc)
    wait_for(lambda: proc.call("counts")["status"].startswith("SCRIPTERROR"),
             what="SCRIPTERROR status")
    (entry / "run").chmod(0o755)
    # no reload: the daemon re-checks the script every few seconds
    assert settle(proc, msg_id, timeout=15)["status"] == "fixed"
