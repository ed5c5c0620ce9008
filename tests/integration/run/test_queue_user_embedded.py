"""A Unix identity per queue in embedded mode as root: real queue daemons
(root), real scripts, real users of the host (``nobody`` and ``daemon``).

Each queue's script runs as its queue's ``user`` (uid, groups, USER and
HOME), reads its own attachment and its credential, and cannot read the
other queue's attachment: the queue's directory is its user's alone (0700).
A daemon that cannot honour the user (the user missing, or unable to pass
through the directories above the queue's) runs nothing and says why; once
the config no longer asks, the messages that waited run.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import signal
import stat
from pathlib import Path

import pytest
from conftest import wait_for
from daemon_util import settle

from rqsys.store import QueueStore

ALPHA, BETA = "nobody", "daemon"  # users every Debian host has
PAYLOAD = os.urandom(2048)
SHOW = r"""
out="$(id -un) $(id -u):$(id -g) groups=$(id -G | tr ' ' ,) home=$HOME user=$USER"
"""
OWN = SHOW + r"""
sum=$(sha256sum < ../attach/payload.bin) || { echo "err own attachment unreadable" >&3; exit 1; }
cred=$(cat "$CREDENTIALS_DIRECTORY/db") || { echo "err credential unreadable" >&3; exit 1; }
echo "done $out own=${sum%% *} cred=$cred" >&3
"""
NEIGHBOUR = SHOW + r"""
if got=$(cat "$RQ_PARAM1" 2>&1); then echo "done $out READ ${#got}" >&3
else echo "done $out refused: ${got##*: }" >&3; fi
"""


@pytest.fixture
def tmp_path(passable_tmp: Path) -> Path:
    """The root (conftest's layout) where the queues' users may pass."""
    return passable_tmp


def attach(proc, tmp_path: Path, **msg) -> str:
    data = tmp_path / "payload.bin"
    data.write_bytes(PAYLOAD)
    msg_id = proc.call("create", msg=msg, state="prep")["msg_id"]
    with open(data, "rb") as f, proc.client() as client:
        client.call("attach", fds=[f.fileno()], msg_id=msg_id, name="payload.bin",
                    md5=hashlib.md5(PAYLOAD).hexdigest())
    proc.call("commit", msg_id=msg_id)
    return msg_id


def ids_of(name: str) -> str:
    entry = pwd.getpwnam(name)
    groups = ",".join(str(g) for g in os.getgrouplist(name, entry.pw_gid))
    return (f"{name} {entry.pw_uid}:{entry.pw_gid} groups={groups} home={entry.pw_dir} "
            f"user={name}")


def test_each_queue_runs_as_its_user_and_cannot_read_the_others(
        layout, make_queue, daemon, tmp_path) -> None:
    # Given two queues, each with a user of its own, one with a root-only credential
    secret = tmp_path / "db"
    secret.write_text("s3cret")
    secret.chmod(0o600)
    make_queue("alpha", OWN, user=ALPHA, credentials={"db": str(secret)})
    make_queue("beta", NEIGHBOUR, user=BETA)
    alpha, beta = daemon("alpha"), daemon("beta")
    # When alpha runs a message with an attachment
    mine = attach(alpha, tmp_path, dest="alpha")
    reply = settle(alpha, mine)
    # Then its script ran as alpha's user and read its own attachment and credential
    digest = hashlib.sha256(PAYLOAD).hexdigest()
    assert (reply["state"], reply["status"]) == (
        "done", f"{ids_of(ALPHA)} own={digest} cred=s3cret")
    # And alpha's directory is its user's alone
    st = os.stat(layout.queue_dir("alpha"))
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (pwd.getpwnam(ALPHA).pw_uid, 0o700)
    # When beta's script tries to read alpha's attachment
    path = QueueStore(layout.queue_dir("alpha")).msg_dir("done", mine) / "attach/payload.bin"
    assert path.read_bytes() == PAYLOAD  # there, for root
    theirs = beta.call("create", msg={"dest": "beta", "param1": str(path)})["msg_id"]
    # Then it is refused by the kernel
    reply = settle(beta, theirs)
    assert reply["status"] == f"{ids_of(BETA)} refused: Permission denied"


def test_a_user_that_cannot_be_honoured_runs_nothing_until_the_config_changes(
        layout, make_queue, daemon, tmp_path) -> None:
    # Given a queue whose user does not exist
    make_queue("gamma", SHOW + 'echo "done $out" >&3', user="no-such-user-rq")
    proc = daemon("gamma")
    msg_id = proc.call("create", msg={"dest": "gamma"})["msg_id"]
    # Then it says why, once, and its message waits in que
    wait_for(lambda: "user no-such-user-rq" in proc.stderr_text(), 10, "the refusal logged")
    assert proc.call("status", msg_id=msg_id)["state"] == "que"
    assert proc.stderr_text().count("does not exist on this host") == 1
    # When the config names a user the daemon can become, and it is reloaded
    effective = layout.queue_dir("gamma") / "config.json"  # what rq-scan would rewrite
    effective.write_text(json.dumps({**json.loads(effective.read_text()), "user": ALPHA}))
    proc.kill(signal.SIGHUP)
    # Then the message runs as that user
    reply = settle(proc, msg_id)
    assert (reply["state"], reply["status"]) == ("done", ids_of(ALPHA))
