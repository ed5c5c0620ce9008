"""The queue-script API through a real daemon: exit rules, pipe commands,
environment, file descriptors, cwd, symlinked scripts and exec_prefix."""

from __future__ import annotations

import json
import os
import time

import pytest
from conftest import wait_for
from daemon_util import install_with_script, job_file, send, settle, store_of

from rqsys.errors import ConfigError

EXIT_RULES = [
    # (script body, final state, words expected in the status)
    ('echo "done all good" >&3; exit 0', "done", "all good"),
    # RQ's text for a script that ends badly without sending err (send_test_sneaky.sh)
    ('echo "done all good" >&3; exit 1', "err",
     "PROCESS EXITED IMPROPERLY - MOVING TO ERR - Completion was done but exit status was pid "),
    ('echo "err broken" >&3; exit 0', "err", "broken"),
    ('echo "err broken" >&3; exit 7', "err", "broken"),
    ("exit 0", "err", "exited 0 without sending done"),
    ("exit 4", "err", "Completion was  but exit status was pid "),
    ('echo "run working" >&3; kill -KILL $$', "err", " SIGKILL (signal 9)"),
    ('echo "run working" >&3; kill -SEGV $$', "err", " SIGSEGV (signal 11)"),
    ('echo "relayed http://other:3333/q/a/20250101.0000.00.000.0" >&3', "relayed",
     "http://other:3333/q/a/20250101.0000.00.000.0"),
    ('echo "err first" >&3; echo "done later" >&3', "done", "later"),
    ('echo "bogus line" >&3; echo "done fine" >&3', "done", "fine"),
]


@pytest.mark.parametrize(("body", "state", "words"), EXIT_RULES)
def test_exit_rule(layout, make_queue, daemon, body, state, words):
    # Given a queue whose script ends in a particular way
    make_queue("q", body)
    proc = daemon("q")
    # When a message runs
    msg_id = send(proc)
    # Then it lands in the expected state with the expected status text
    reply = settle(proc, msg_id)
    assert reply["state"] == state
    assert words in reply["status"]
    assert store_of(layout, "q").read_status(state, msg_id) == reply["status"]


def test_run_lines_report_progress(layout, make_queue, daemon):
    make_queue("q", """
        echo "run step 1 of 2" >&3
        while [ ! -e go ]; do sleep 0.02; done
        echo "done both steps" >&3
    """)
    proc = daemon("q")
    msg_id = send(proc)
    wait_for(lambda: proc.call("status", msg_id=msg_id) == {
        "ok": True, "state": "run", "status": "step 1 of 2"}, what="run status")
    assert store_of(layout, "q").read_status("run", msg_id) == "step 1 of 2"
    job_file(layout, "q", msg_id, "go").write_text("")
    assert settle(proc, msg_id)["status"] == "both steps"


def test_resend_requeues_with_due(layout, make_queue, daemon):
    make_queue("q", 'echo "resend 30-try later" >&3')
    proc = daemon("q")
    before = time.time()
    msg_id = send(proc)
    reply = settle(proc, msg_id, ("que",))
    wait_for(lambda: proc.call("status", msg_id=msg_id)["status"] == "try later",
             what="resend status")
    msg = proc.call("get", msg_id=msg_id)["msg"]
    assert msg["count"] == 1  # RQ's count: one resend
    assert before + 29 <= msg["due"] <= time.time() + 31
    assert reply["state"] == "que"


def test_resend_up_to_max_count_then_err(layout, make_queue, daemon):
    make_queue("q", 'echo "count=$RQ_COUNT"; echo "resend 0-again" >&3')
    proc = daemon("q")
    msg_id = send(proc, max_count=3)
    reply = settle(proc, msg_id)
    assert reply["state"] == "err"
    assert reply["status"] == "HIT MAX RESEND COUNT - MOVING TO ERR - again"
    log = job_file(layout, "q", msg_id, "stdio.log").read_text()
    assert log.split() == ["count=0", "count=1", "count=2"]  # RQ_COUNT: resends so far
    assert proc.call("get", msg_id=msg_id)["msg"]["count"] == 3


ENV_DUMP = 'env | grep "^RQ_" | sort > env.txt; echo "$MYVAR" > myvar.txt; echo done >&3'


def _env_of(layout, msg_id, name="q"):
    text = job_file(layout, name, msg_id, "env.txt").read_text()
    return dict(line.split("=", 1) for line in text.splitlines())


def test_every_rq_variable(layout, make_queue, daemon, tmp_path):
    entry = make_queue("q", ENV_DUMP, env_vars={"MYVAR": "mine"})
    proc = daemon("q")
    msg_id = send(proc, param1="a b", param2="2", param3="", param4="four",
                  orig_msg_id="http://h:1/q/x/20240101.0000.00.000.0")
    assert settle(proc, msg_id)["state"] == "done"
    env = _env_of(layout, msg_id)
    url = proc.call("get", msg_id=msg_id)["url"]
    host = url.split("q/q/")[0]
    job = store_of(layout, "q").msg_dir("run", msg_id) / "job"
    real = os.path.realpath(entry / "run")
    assert env == {
        "RQ_SCRIPT": real, "RQ_REALSCRIPT": real, "RQ_HOST": host,
        "RQ_DEST": f"{host}q/q/", "RQ_DEST_QUEUE": "q", "RQ_MSG_ID": msg_id,
        "RQ_FULL_MSG_ID": url, "RQ_MSG_DIR": str(job), "RQ_READ": "4", "RQ_WRITE": "3",
        "RQ_COUNT": "0", "RQ_PARAM1": "a b", "RQ_PARAM2": "2", "RQ_PARAM3": "",
        "RQ_PARAM4": "four", "RQ_FORCE_REMOTE": "0", "RQ_PORT": host.split(":")[2].rstrip("/"),
        "RQ_ENV": env["RQ_ENV"], "RQ_VER": env["RQ_VER"],
        "RQ_ORIG_MSG_ID": "http://h:1/q/x/20240101.0000.00.000.0"}
    assert env["RQ_ENV"] and env["RQ_VER"]
    assert job_file(layout, "q", msg_id, "myvar.txt").read_text() == "mine\n"


def test_daemon_environment_cannot_leak_rq_values(layout, make_queue, daemon):
    make_queue("q", ENV_DUMP)
    proc = daemon("q", env={"RQ_PARAM1": "leaked", "RQ_COUNT": "99"})
    msg_id = send(proc, param1="real")
    settle(proc, msg_id)
    env = _env_of(layout, msg_id)
    assert (env["RQ_PARAM1"], env["RQ_COUNT"]) == ("real", "0")


@pytest.mark.parametrize("var", ["RQ_MSG_ID", "RQ_PARAM1", "RQ_ANYTHING"])
def test_env_vars_cannot_set_rq_variables(make_queue, var):
    with pytest.raises(ConfigError, match="env_vars"):
        make_queue("q", ENV_DUMP, env_vars={var: "x"})


FD_CHECK = """
import json, os, stat, sys
info = {"cwd": os.getcwd(), "stdin": sys.stdin.read(), "open": sorted(
    int(fd) for fd in os.listdir("/proc/self/fd"))}
for fd in range(5):
    st = os.fstat(fd)
    info[str(fd)] = [stat.S_ISFIFO(st.st_mode), st.st_ino,
                     os.readlink(f"/proc/self/fd/{fd}")]
info["log_ino"] = os.stat("stdio.log").st_ino
info["pgid"], info["sid"], info["pid"] = os.getpgid(0), os.getsid(0), os.getpid()
json.dump(info, open("fds.json", "w"))
print("to stdout"); print("to stderr", file=sys.stderr); sys.stdout.flush()
os.write(3, b"done checked\\n")
"""


def test_fds_cwd_and_session(layout, make_queue, daemon):
    make_queue("q", FD_CHECK, shebang="#!/usr/bin/python3")
    proc = daemon("q")
    msg_id = send(proc)
    assert settle(proc, msg_id)["status"] == "checked"
    info = json.loads(job_file(layout, "q", msg_id, "fds.json").read_text())
    assert info["cwd"].endswith(f"/run/{msg_id}/job")
    assert info["stdin"] == "" and info["0"][2] == "/dev/null"
    assert info["1"][1] == info["2"][1] == info["log_ino"]
    assert info["3"][0] and info["4"][0] and info["3"][1] != info["4"][1]
    # 0-4 plus the fd listdir itself had open: nothing else leaked in
    assert len(info["open"]) == 6 and info["open"][:5] == [0, 1, 2, 3, 4]
    assert info["pgid"] == info["sid"] == info["pid"]
    log = job_file(layout, "q", msg_id, "stdio.log").read_text()
    assert log == "to stdout\nto stderr\n"


def _symlinked_queue(layout, tmp_path, body_a, body_b):
    scripts = tmp_path / "versions"
    scripts.mkdir()
    for name, body in (("a", body_a), ("b", body_b)):
        path = scripts / name
        path.write_text(f"#!/bin/bash\n{body}\n")
        path.chmod(0o755)
    link = tmp_path / "current"
    link.symlink_to(scripts / "a")
    install_with_script(layout, "q", str(link))
    return link, scripts


def test_symlinked_script_resolved(layout, daemon, tmp_path):
    link, scripts = _symlinked_queue(layout, tmp_path, ENV_DUMP, ENV_DUMP)
    proc = daemon("q")
    msg_id = send(proc)
    settle(proc, msg_id)
    env = _env_of(layout, msg_id)
    assert env["RQ_SCRIPT"] == str(link)
    assert env["RQ_REALSCRIPT"] == str(scripts / "a")


def test_swapping_symlink_does_not_touch_running_script(layout, daemon, tmp_path):
    wait_then = 'while [ ! -e go ]; do sleep 0.02; done; echo "done {}" >&3'
    link, scripts = _symlinked_queue(layout, tmp_path, wait_then.format("A"),
                                     'echo "done B" >&3')
    proc = daemon("q")
    first = send(proc)
    settle(proc, first, ("run",))
    # When the link is swapped to b while a runs
    tmp_link = tmp_path / "next"
    tmp_link.symlink_to(scripts / "b")
    os.replace(tmp_link, link)
    job_file(layout, "q", first, "go").write_text("")
    # Then the running one finishes as a; the next message runs b
    assert settle(proc, first)["status"] == "A"
    assert settle(proc, send(proc))["status"] == "B"


def test_exec_prefix(layout, make_queue, daemon):
    make_queue("q", 'echo "done $FROM_PREFIX $0" >&3', exec_prefix="env FROM_PREFIX=yes")
    proc = daemon("q")
    reply = settle(proc, send(proc))
    assert reply["state"] == "done"
    assert reply["status"].startswith("yes /")


def test_exec_prefix_bash_login(layout, make_queue, daemon):
    make_queue("q", 'echo "done login=$(shopt -q login_shell && echo y)" >&3',
               exec_prefix="bash -l")
    proc = daemon("q")
    assert settle(proc, send(proc))["status"] == "login=y"
