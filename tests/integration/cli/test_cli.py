"""The ``rq`` command line against a real daemon: output shapes, exit codes,
stderr lines, short ids and full URLs."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys

import pytest
from daemon_util import RQ, rq, send, settle

import rqsys

URL_RE = re.compile(r"^ok (http://[^ ]+/q/q/(\d{8}\.\d{4}\.\d{2}\.\d{3}\.\d+))$")


@pytest.fixture
def q(make_queue, daemon):
    make_queue("q", 'echo "done greeted $RQ_PARAM1" >&3')
    return daemon("q")


def _sent(layout, *extra):
    match = URL_RE.match(rq(layout, "sendmesg", "--dest", "q", *extra))
    assert match, "sendmesg must print ok <full url>"
    return match.group(1), match.group(2)


def test_sendmesg_and_statusmesg(layout, q):
    url, msg_id = _sent(layout, "--param1", "you")
    settle(q, msg_id)
    assert rq(layout, "statusmesg", "--msg_id", msg_id) == "ok done - greeted you"
    assert rq(layout, "statusmesg", "--msg_id", url) == "ok done - greeted you"
    assert rq(layout, "state", "--msg_id", url) == "ok done"
    assert q.call("get", msg_id=msg_id)["msg"]["param1"] == "you"


def test_statusmesg_without_status_text(layout, q):
    out = rq(layout, "prepmesg", "--dest", "q")
    msg_id = out.rsplit("/", 1)[1]
    assert rq(layout, "statusmesg", "--msg_id", msg_id) == "ok prep"


def test_two_phase_send_with_attachment(layout, q, tmp_path):
    data = tmp_path / "data.txt"
    data.write_text("payload\n")
    msg_id = rq(layout, "prepmesg", "--dest", "q").rsplit("/", 1)[1]
    md5 = hashlib.md5(b"payload\n").hexdigest()
    assert rq(layout, "attachmesg", "--msg_id", msg_id, "--pathname", str(data)) == \
        f"ok {md5}-Attached successfully for Message: {msg_id} attachment"
    assert rq(layout, "commitmesg", "--msg_id", msg_id).endswith(f"/q/q/{msg_id}")
    settle(q, msg_id)
    assert q.call("get", msg_id=msg_id)["attachments"]["data.txt"]["md5"] == md5


def test_sendmesg_with_attach(layout, q, tmp_path):
    data = tmp_path / "a.bin"
    data.write_bytes(b"\x00\x01")
    _url, msg_id = _sent(layout, "--attach", str(data))
    assert settle(q, msg_id)["state"] == "done"
    assert list(q.call("get", msg_id=msg_id)["attachments"]) == ["a.bin"]


def test_single_que_and_clone(layout, q):
    q.call("adminoper", oper="pause")
    first = rq(layout, "single_que", "--dest", "q", "--param1", "same")
    assert rq(layout, "single_que", "--dest", "q", "--param1", "same") == first
    assert rq(layout, "single_que", "--dest", "q", "--param1", "other") != first
    clone = rq(layout, "clone", "--msg_id", first.split(" ", 1)[1])
    assert URL_RE.match(clone) and clone != first
    assert q.call("counts")["counts"]["que"] == 3


def test_delete_run_now_adminoper(layout, q):
    q.call("adminoper", oper="pause")
    _url, msg_id = _sent(layout)
    assert rq(layout, "delete", "--msg_id", msg_id) == "ok deleted"
    assert rq(layout, "adminoper", "--queue", "q", "--oper", "resume") == "ok UP"
    _url, later = _sent(layout, "--due", "9999999999")
    assert rq(layout, "run_now", "--msg_id", later) == "ok run_now"
    assert settle(q, later)["state"] == "done"


@pytest.mark.parametrize(("args", "words"), [
    (["statusmesg", "--msg_id", "20200101.0000.00.000.0"], "no message"),
    (["statusmesg", "--msg_id", "../../etc"], "invalid message id"),
    (["statusmesg", "--msg_id", "http://h:3333/q/q/nonsense"], "invalid message id"),
    (["sendmesg", "--dest", "nosuchq"], "no queue named nosuchq"),
    (["sendmesg", "--dest", "bad/name"], "invalid queue name"),
    (["attachmesg", "--msg_id", "20200101.0000.00.000.0", "--pathname", "/nonexistent"],
     "no message"),
])
def test_fail_exit_1(layout, q, args, words):
    assert words in rq(layout, *args, code=1)


def test_queue_down_exit_1(layout, q):
    rq(layout, "adminoper", "--queue", "q", "--oper", "down")
    assert "DOWN" in rq(layout, "sendmesg", "--dest", "q", code=1)


def test_attach_missing_file_exit_1(layout, q):
    msg_id = rq(layout, "prepmesg", "--dest", "q").rsplit("/", 1)[1]
    out = rq(layout, "attachmesg", "--msg_id", msg_id, "--pathname", "/nonexistent", code=1)
    assert "cannot read /nonexistent" in out


def test_daemon_not_running_exit_3(layout, make_queue):
    make_queue("q", "echo done >&3")
    assert "not running" in rq(layout, "sendmesg", "--dest", "q", code=3)


@pytest.mark.parametrize("args", [
    ["sendmesg"], ["sendmesg", "--dest", "q", "--due", "soon"], ["nosuchverb"],
    ["adminoper", "--queue", "q", "--oper", "explode"]])
def test_usage_errors_exit_2(layout, args):
    proc = subprocess.run([*RQ, "--root", str(layout.root), *args], capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 2 and proc.stdout == ""
    if args == ["nosuchverb"]:  # one line, not the usage and all the verbs
        assert proc.stderr == "rq: unknown verb 'nosuchverb' (rq --help lists them)\n"
    else:
        assert "usage: rq" in proc.stderr


@pytest.mark.parametrize("name", ["../etc", "a/b", ".hidden"])
def test_rqsys_queue_refuses_bad_names(layout, name):
    proc = subprocess.run([sys.executable, "-m", "rqsys", "--root", str(layout.root),
                           "queue", name], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    assert "invalid queue name" in proc.stderr and "Traceback" not in proc.stderr


def test_a_short_id_held_by_two_queues_needs_the_full_url(layout, make_queue):
    # Given two queues that both hold a message with the same short id
    from rqsys.store import IdMaker, QueueStore

    for name in ("a", "b"):
        make_queue(name, 'echo "done" >&3')
        QueueStore(layout.queue_dir(name), IdMaker(clock=lambda: 1e9)).create({"dest": name})
    short = "20010909.0146.40.000.0"
    # When the short id is asked for, it fails and says why (no guessing)
    out = rq(layout, "state", "--msg_id", short, code=1)
    assert "in queues a, b" in out and "full message URL" in out


def test_root_may_follow_the_verb(layout, q):
    # Given a message sent with --root before the verb
    _url, msg_id = _sent(layout)
    settle(q, msg_id)
    # When --root comes after the verb (as `rqsys serve --root DIR` is written)
    proc = subprocess.run([*RQ, "state", "--msg_id", msg_id, "--root", str(layout.root)],
                          capture_output=True, text=True, timeout=30)
    # Then it finds the same state directory
    assert (proc.returncode, proc.stdout) == (0, "ok done\n"), proc.stderr


def test_a_missing_root_is_named_not_blamed_on_the_queue(tmp_path):
    # Given no state directory where rq looks (make run's root not given: it said
    # "no queue named hello" while the dashboard showed hello)
    missing = tmp_path / "nowhere"
    for env_root, args in ((None, ["--root", str(missing)]), (str(missing), [])):
        env = {k: v for k, v in os.environ.items() if k != "RQ_ROOT"}
        if env_root:
            env["RQ_ROOT"] = env_root
        proc = subprocess.run([*RQ, *args, "sendmesg", "--dest", "hello"], env=env,
                              capture_output=True, text=True, timeout=30)
        # Then one line names the directory and how to give it, and nothing is made
        assert proc.returncode == 1
        assert proc.stdout == (f"fail no rqsys state directory at {missing}: pass --root DIR "
                               "or set RQ_ROOT to the one rqsys serves (make run prints it)\n")
        assert proc.stderr == "rq: " + proc.stdout[len("fail "):]
        assert not missing.exists()


def test_queues_lists_each_queue_with_its_admin_state_and_counts(layout, make_queue, daemon):
    make_queue("alpha", "echo done >&3")
    make_queue("beta", "echo done >&3")
    proc = daemon("alpha")
    msg_id = send(proc)
    settle(proc, msg_id)
    daemon("beta")
    rq(layout, "adminoper", "--queue", "beta", "--oper", "pause")
    lines = rq(layout, "queues").split("\n")
    assert lines[0] == "ok 2"
    assert lines[1] == "alpha\tUP\tprep=0 que=0 run=0 done=1 err=0 relayed=0"
    assert lines[2] == "beta\tPAUSE\tprep=0 que=0 run=0 done=0 err=0 relayed=0"


@pytest.mark.parametrize("prog", ["rq", "rqsys"])
def test_version_and_a_mistyped_verb(prog, tmp_path):
    entry = RQ if prog == "rq" else [sys.executable, "-m", "rqsys"]
    got = subprocess.run([*entry, "--version"], capture_output=True, text=True, timeout=30)
    assert got.returncode == 0 and got.stdout == f"{prog} {rqsys.__version__}\n"
    typo = "sendmsg" if prog == "rq" else "sevre"
    got = subprocess.run([*entry, "--root", str(tmp_path), typo], capture_output=True,
                         text=True, timeout=30)
    # one line, the nearest verb, argparse's usage code; not every verb listed
    want = "sendmesg" if prog == "rq" else "serve"
    assert got.returncode == 2 and got.stdout == ""
    assert got.stderr == f"{prog}: unknown verb {typo!r}: did you mean {want}?\n"


@pytest.mark.parametrize(("path", "why"), [("/nonexistent", "No such file or directory"),
                                         ("/tmp", "Is a directory")])
def test_a_send_whose_attachment_fails_leaves_no_message_in_prep(layout, make_queue, daemon,
                                                                  path, why):
    make_queue("q", "echo done >&3")
    proc = daemon("q")
    out = rq(layout, "sendmesg", "--dest", "q", "--attach", path, code=1)
    assert out == f"fail cannot read {path}: {why}; nothing was sent"
    counts = proc.call("counts")["counts"]
    assert counts["prep"] == 0 and counts["que"] == 0


def test_a_failure_is_said_once_when_stderr_goes_where_stdout_does(layout, q):
    # RQ's "fail <why>" on stdout; "rq: <why>" on stderr too, unless 2>&1 made them one
    argv = [*RQ, "--root", str(layout.root), "state", "--msg_id", "20240101.0000.00.001"]
    both = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=60)
    assert both.returncode == 1 and both.stdout.count("no message") == 1, both.stdout
    apart = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert apart.stdout.startswith("fail ") and apart.stderr.startswith("rq: "), apart
