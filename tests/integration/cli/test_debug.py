"""``rq debug ID`` against a real daemon: a failed message's run made again in a
scratch directory (its environment, params, attachments and script), run there
(also under strace) or looked at, the message itself untouched; and ``rq``'s
queue argument and failure lines."""

from __future__ import annotations

import json
import os
import pty
import shutil
import subprocess

import pytest
from daemon_util import RQ, rq, send, settle

SCRIPT = """
echo "param $RQ_PARAM1 count $RQ_COUNT debug ${RQ_DEBUG:-no}"
echo "run reading $(cat "$RQ_MSG_DIR/../attach/rows.csv")" >&3
[ -n "$RQ_DEBUG" ] && pwd > "$RQ_MSG_DIR/../where"
echo "ValueError: bad row $RQ_PARAM1" >&2
exit 3
"""


@pytest.fixture
def failed(layout, make_queue, daemon, tmp_path):
    """A message that failed, with a param and an attachment."""
    make_queue("q", SCRIPT)
    proc = daemon("q")
    rows = tmp_path / "rows.csv"
    rows.write_text("a,b\n")
    url = rq(layout, "sendmesg", "--dest", "q", "--param1", "7", "--attach", str(rows))[3:]
    msg_id = url.rsplit("/", 1)[1]
    assert settle(proc, msg_id)["state"] == "err"
    return proc, msg_id


def _snapshot(layout, msg_id):
    root = layout.queue_dir("q")
    return sorted((str(p.relative_to(root)), p.stat().st_mtime_ns, p.stat().st_size)
                  for p in root.rglob("*") if msg_id in str(p))


def test_debug_makes_the_run_again_and_leaves_the_message_alone(layout, failed, tmp_path):
    proc, msg_id = failed
    before = _snapshot(layout, msg_id)
    where = tmp_path / "scratch"
    out = rq(layout, "debug", msg_id, "--dir", str(where)).splitlines()
    assert out[0] == f"ok {where}" and "run.sh" in out[1]
    env = (where / "env").read_text()
    assert "RQ_PARAM1=7\n" in env and f"RQ_MSG_ID={msg_id}\n" in env
    assert f"RQ_MSG_DIR={where}/job\n" in env and "RQ_DEBUG=1\n" in env
    script = os.path.realpath(json.loads((layout.queue_dir("q") / "config.json").read_text())[
        "script"])
    assert f"RQ_REALSCRIPT={script}\n" in env  # the script, as the daemon names it
    assert (where / "env").stat().st_mode & 0o777 == 0o600  # env_vars may hold secrets
    attached = where / "attach" / "rows.csv"
    assert attached.read_text() == "a,b\n"
    original = next(layout.queue_dir("q").rglob(f"{msg_id}/attach/rows.csv"))
    assert attached.stat().st_ino == original.stat().st_ino  # linked, not copied
    # run it: the script's output on the terminal, its status lines after, its exit
    ran = subprocess.run([*RQ, "--root", str(layout.root), "debug", msg_id, "--dir",
                          str(tmp_path / "again"), "--run"], capture_output=True, text=True,
                         timeout=30)
    assert ran.returncode == 1
    assert "param 7 count 0 debug 1" in ran.stdout and "status: run reading a,b" in ran.stdout
    assert "ValueError: bad row 7" in ran.stderr and "the script exited 3" in ran.stderr
    assert (tmp_path / "again" / "where").read_text().strip() == str(tmp_path / "again/job")
    # and the message is as it was, in err
    assert proc.call("status", msg_id=msg_id)["state"] == "err"
    assert _snapshot(layout, msg_id) == before


def test_debug_under_strace(layout, failed, tmp_path):
    if shutil.which("strace") is None:
        pytest.fail("strace is not installed (make install-test installs it)")
    _proc, msg_id = failed
    ran = subprocess.run([*RQ, "--root", str(layout.root), "debug", msg_id, "--dir",
                          str(tmp_path / "s"), "--run", "--strace"], capture_output=True,
                         text=True, timeout=60)
    assert ran.returncode == 1 and f"strace: {tmp_path}/s/strace.log" in ran.stdout
    assert "execve(" in (tmp_path / "s" / "strace.log").read_text()


def test_debug_refuses_bad_asks(layout, failed, tmp_path):
    _proc, msg_id = failed
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("")
    assert rq(layout, "debug", msg_id, "--dir", str(full), code=1) == \
        f"fail --dir {full} is not empty"
    assert rq(layout, "debug", "20200101.0000.00.000.9", code=1) == \
        "fail no message 20200101.0000.00.000.9 in any queue"
    assert rq(layout, "debug", msg_id, "--strace", code=1) == "fail --strace goes with --run"
    assert rq(layout, "debug", "../etc", code=1).startswith("fail invalid message id")


def test_every_verb_takes_the_queue_as_an_argument_or_as_queue(layout, make_queue, daemon):
    make_queue("q", "echo done >&3")
    proc = daemon("q")
    settle(proc, send(proc))
    assert rq(layout, "ls", "q", "--state", "done") == rq(layout, "ls", "--queue", "q",
                                                          "--state", "done")
    assert rq(layout, "adminoper", "q", "--oper", "pause") == "ok PAUSE"
    assert rq(layout, "adminoper", "--queue", "q", "--oper", "resume") == "ok UP"
    assert rq(layout, "stats", "--queue", "q").startswith("queue q: UP")
    assert rq(layout, "groups", "--queue", "q") == ""
    for args, said in ((["ls"], "no queue"), (["stats", "q", "--queue", "r"], "two queues")):
        got = subprocess.run([*RQ, "--root", str(layout.root), *args], capture_output=True,
                             text=True, timeout=30)
        assert got.returncode == 2
        assert got.stderr == f"rq {args[0]}: {said}: name one, as QUEUE or --queue QUEUE\n"


def test_a_failure_on_a_terminal_is_said_once(layout, make_queue, daemon):
    make_queue("q", "echo done >&3")
    daemon("q")
    main, tty = pty.openpty()
    try:
        proc = subprocess.run([*RQ, "--root", str(layout.root), "statusmesg", "--msg_id",
                               "20200101.0000.00.000.9"], stdout=tty, stderr=tty,
                              timeout=30)
        os.close(tty)
        shown = b""
        while True:
            try:
                chunk = os.read(main, 4096)
            except OSError:  # EIO: the terminal's other end closed
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(main)
    assert proc.returncode == 1
    assert shown.decode().splitlines() == ["fail no message 20200101.0000.00.000.9 in any queue"]
