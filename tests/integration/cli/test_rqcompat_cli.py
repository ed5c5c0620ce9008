"""The ``rq`` command line as RQ's own tests and scripts call it (drudru/rq
``code/rq.rb``), and ``rqsys``'s error contract, against real daemons."""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys

import pytest
from daemon_util import settle

from rqsys.cli import admin
from rqsys.cli import rq as cli
from rqsys.wire import client

RQ = [sys.executable, "-c", "import sys; from rqsys.cli.rq import rq_main; sys.exit(rq_main())"]
RQSYS = [sys.executable, "-m", "rqsys"]


def rq(layout, *args: str) -> str:
    proc = subprocess.run([*RQ, "--root", str(layout.root), *args], capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 0 and proc.stderr == "", (proc.stdout, proc.stderr)
    return proc.stdout


@pytest.fixture
def test_q(make_queue, daemon):
    make_queue("test", 'echo "done done sleeping" >&3')
    return daemon("test")


@pytest.fixture
def relay_q(make_queue, daemon):
    """A stand-in relay queue, paused: what arrives there stays to be looked at."""
    make_queue("relay", 'echo "done" >&3')
    relay = daemon("relay")
    relay.call("adminoper", oper="pause")
    return relay


def test_rqs_argument_forms_and_statuscountmesg(layout, test_q):
    # Given RQ's way of writing options: --k=v, --k v, and its --relay-ok consent
    test_q.call("adminoper", oper="pause")
    out = rq(layout, "sendmesg", "--dest", "test", "--src", "dru4", "--relay-ok",
             "--param1=done", "--count=2", "--max_count", "5")
    # Then the message is sent with the fields as given (count kept, as RQ keeps it)
    assert out.startswith("ok http://") and out.endswith("\n")
    url = out.split()[1]
    msg = test_q.call("get", msg_id=url.rsplit("/", 1)[1])["msg"]
    assert (msg["src"], msg["param1"], msg["count"], msg["max_count"]) == ("dru4", "done", 2, 5)
    assert rq(layout, "statuscountmesg", "--msg_id", url) == "ok 2\n"


def test_attach_texts_are_rqs(layout, test_q, tmp_path):
    data = tmp_path / "studio3.jpg"
    data.write_bytes(os.urandom(96007))
    md5 = hashlib.md5(data.read_bytes()).hexdigest()
    url = rq(layout, "prepmesg", "--dest", "test", "--relay-ok", "--param1=done").split()[1]
    # attachmesg: RQ's sentence, naming the message as it was given
    assert rq(layout, "attachmesg", "--msg_id", url, "--pathname", str(data)) == \
        f"ok {md5}-Attached successfully for Message: {url} attachment\n"
    # attachstatusmesg: the count, then "name md5 size path" with a path that exists
    count, line = rq(layout, "attachstatusmesg", "--msg_id", url).splitlines()
    name, got_md5, size, path = line.split()
    assert (count, name, got_md5, size) == ("ok 1", "studio3.jpg", md5, "96007")
    assert os.path.isfile(path)
    rq(layout, "commitmesg", "--msg_id", url)
    settle(test_q, url.rsplit("/", 1)[1])
    assert rq(layout, "statusmesg", "--msg_id", url) == "ok done - done sleeping\n"
    assert rq(layout, "attachstatusmesg", "--msg_id", url).startswith("ok 1\nstudio3.jpg ")


def test_a_message_without_attachments_has_none(layout, test_q):
    url = rq(layout, "prepmesg", "--dest", "test").split()[1]
    assert rq(layout, "attachstatusmesg", "--msg_id", url) == "ok 0\n"


@pytest.mark.parametrize("dest", ["http://127.0.0.1:3333/q/test", "http://far.example/q/x"])
def test_every_url_dest_goes_through_the_relay_queue(layout, test_q, relay_q, dest):
    # As RQ's rq: a URL dest, this host's own included, is queued in relay
    url = rq(layout, "sendmesg", "--dest", dest, "--relay-ok", "--param1=done").split()[1]
    assert "/q/relay/" in url
    assert relay_q.call("get", msg_id=url.rsplit("/", 1)[1])["msg"]["dest"] == dest
    assert test_q.call("counts")["counts"]["que"] == 0


def test_force_remote_sends_a_local_name_through_the_relay(layout, test_q, relay_q):
    url = rq(layout, "sendmesg", "--dest", "test", "--force_remote", "--param1=done").split()[1]
    msg = relay_q.call("get", msg_id=url.rsplit("/", 1)[1])["msg"]
    assert "/q/relay/" in url and msg["force_remote"] is True and msg["dest"] == "test"


def test_rqsys_dispatch_table_covers_every_subcommand():
    subparsers = next(a for a in admin.rqsys_parser()._actions
                      if isinstance(a, argparse._SubParsersAction))
    assert set(subparsers.choices) == set(admin.RQSYS_COMMANDS)


@pytest.mark.parametrize("args, words", [
    (["queue", "nosuch"], "queue/nosuch/config.json: no such file"),
    (["serve", "--port", "1"], "config.json"),
    (["scan"], "config.json"),
])
def test_rqsys_errors_are_one_line_never_a_traceback(layout, args, words):
    # Given a broken config.json (and no queue named nosuch)
    layout.config_file.write_text("{broken")
    if args[0] == "queue":
        layout.config_file.unlink()
    proc = subprocess.run([*RQSYS, "--root", str(layout.root), *args], capture_output=True,
                          text=True, timeout=30)
    # Then one line on stderr says why, and the exit status is not 0
    assert proc.returncode == cli.RET_FAIL, proc.stderr
    assert proc.stderr.startswith("rqsys: ") and proc.stderr.count("\n") == 1
    assert words in proc.stderr and "Traceback" not in proc.stderr


SYSCONFIG = {"host": "box", "port": 3333, "relative_root": "/"}


@pytest.mark.parametrize("dest, force, queue", [
    ("test", False, "test"), ("test", True, "relay"),
    ("http://box:3333/q/test", False, "relay"), ("http://far:3333/q/test", False, "relay")])
def test_queue_for_dest_is_rqs_rule(dest, force, queue):
    assert client.queue_for_dest(dest, force) == queue


@pytest.mark.parametrize("url, queue", [
    ("http://box:3333/q/test", "test"), ("http://127.0.0.1:3333/q/test", "test"),
    ("http://box:4444/q/test", None), ("http://far:3333/q/test", None), ("test", None)])
def test_local_queue_of(url, queue):
    assert client.local_queue_of(url, SYSCONFIG) == queue


def test_rq_starts_without_jsonschema():
    # RQ's tests (single_que, coalesce) time their sends in seconds: rq must start fast,
    # and validation happens in the daemon anyway
    code = "import sys, rqsys.cli.rq; print('jsonschema' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == "False", out.stderr
