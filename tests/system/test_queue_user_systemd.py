"""A queue's config ``user`` under a real booted systemd (tests/helpers/nspawn.py).

rq-scan writes a drop-in of ``rq@<queue>.service`` for a queue with ``"user"``:
``User=`` (or ``DynamicUser=yes``), its group, ``SupplementaryGroups=rq`` and an
``ExecStartPre=+rqsys queue-owner %i`` that hands the queue's directory to that
user, group ``rq-web``, 2750.  So the daemon and its scripts run as that user,
a queue of user rq cannot read the other's files while the console's group
can, and a queue without the user gets its directory back (rq:rq, 2770), as a
queue given one later hands it all over.  The daemon, whoever it runs as,
goes on writing its audit trail and its batch members' ends (group rq).  A
user that does not exist runs nothing: the message stays queued and the
journal says why.
"""

from __future__ import annotations

import json
import re
import secrets
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import need, wait_for
from nspawn import Container, booted_with_units, can_boot

from rqsys.errors import NotFound
from rqsys.store import QueueStore

VENV_BIN = Path(sys.executable).parent
RQ = str(VENV_BIN / "rq")
OPT = "/opt/usertest"
DROP_IN = "/etc/systemd/system/rq@{}.service.d/50-rqsys-user.conf"
DYNAMIC_UIDS = range(61184, 65520)  # systemd's DynamicUser= range
ENDED = 120.0  # seconds a message has to end: a slow host, a daemon starting
SECRET = "alice-secret-" + secrets.token_hex(8)
WHO = """\
#!/bin/sh
echo "done user $(id -un) uid $(id -u) groups $(id -Gn)" >&3
"""
READER = """\
#!/bin/sh
if err=$(cat -- "$RQ_PARAM1" 2>&1 >/dev/null); then echo "done READ" >&3
else echo "done refused: ${err##*: }" >&3; fi
"""


@pytest.fixture(scope="module")
def box() -> Iterator[Container]:
    """A container with rq-scan and a user rqalice."""
    reason = can_boot()
    need(not reason, reason)
    with booted_with_units(VENV_BIN.parent, "rq-scan.service") as box:
        box.run("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                "rqalice")
        box.path(f"{OPT}/attach.txt").parent.mkdir(parents=True)
        box.path(f"{OPT}/attach.txt").write_text(SECRET)
        yield box


@pytest.fixture(scope="module")
def ua(box: Container) -> Container:
    """Queue ua, run as user rqalice."""
    install(box, "ua", WHO, {"user": "rqalice"})
    return box


def install(box: Container, queue: str, script: str, cfg: dict[str, object]) -> None:
    entry = box.path(f"{OPT}/{queue}")
    entry.mkdir(parents=True)
    (entry / "run").write_text(script)
    (entry / "run").chmod(0o755)
    (entry / "config.json").write_text(json.dumps(cfg))
    box.run("ln", "-s", f"{OPT}/{queue}", f"/var/lib/rq/scandir/{queue}")
    wait_for(lambda: box.show(f"rq@{queue}.socket", "ActiveState") == "active", 60,
             f"rq@{queue}.socket active")


def send(box: Container, queue: str, *options: str) -> str:
    """Send a message to ``queue``; its id."""
    out = box.run(RQ, "sendmesg", "--dest", queue, *options).stdout.strip()
    assert out.startswith("ok http://"), out
    return out.rsplit("/", 1)[1]


def state_of(store: QueueStore, msg_id: str) -> str:
    try:
        return store.find(msg_id)
    except NotFound:
        return ""  # between two states


def run_one(box: Container, queue: str, *options: str) -> tuple[str, str, str]:
    """Send a message and wait for its end; (its id, state, status)."""
    msg_id = send(box, queue, *options)
    store = QueueStore(box.path(f"/var/lib/rq/queue/{queue}"))

    def ended() -> str:
        state = state_of(store, msg_id)
        return state if state in ("done", "err") else ""

    state = wait_for(ended, ENDED, f"{queue} {msg_id} ended")
    return msg_id, state, store.read_status(state, msg_id)


def journal(box: Container, *units: str) -> str:
    argv = [a for unit in units for a in ("-u", unit)]
    return box.run("journalctl", "--no-pager", "-n", "200", *argv).stdout


def owner(box: Container, path: str) -> str:
    """``user group mode`` of a path inside the container."""
    return box.run("stat", "-c", "%U %G %a", path).stdout.strip()


def main_uid(box: Container, queue: str) -> int:
    """The real uid of queue ``queue``'s daemon (MainPID), read in its /proc."""
    pid = box.show(f"rq@{queue}.service", "MainPID")
    assert pid not in ("", "0"), journal(box, f"rq@{queue}.service")
    status = box.run("cat", f"/proc/{pid}/status").stdout
    return int(next(line.split()[1] for line in status.splitlines()
                    if line.startswith("Uid:")))


def uid_of(box: Container, user: str) -> int:
    return int(box.run("id", "-u", user).stdout)


def inside(box: Container, path: Path) -> str:
    """A host path into the container, as the container names it."""
    return "/" + str(path.relative_to(box.root))


def test_a_queue_runs_as_its_user_and_its_directory_is_private(ua: Container) -> None:
    # Given queue ua with "user": "rqalice"
    box = ua
    # When a message with an attachment runs
    msg_id, state, status = run_one(box, "ua", "--attach", f"{OPT}/attach.txt")
    # Then its script ran as rqalice, with group rq beside its own
    why = journal(box, "rq@ua.service", "rq-scan.service")
    assert state == "done" and status.startswith("user rqalice uid "), f"{status}\n{why}"
    assert "rq" in status.split(" groups ", 1)[1].split(), status
    # And the unit's drop-in says so, and its daemon runs as rqalice too
    dropin = box.path(DROP_IN.format("ua")).read_text().splitlines()
    for line in ("User=rqalice", "Group=rqalice", "SupplementaryGroups=rq"):
        assert line in dropin, dropin
    assert [x for x in dropin if re.fullmatch(r"ExecStartPre=\+/\S*/rqsys queue-owner %i", x)]
    assert main_uid(box, "ua") == uid_of(box, "rqalice"), why
    # And its directory is rqalice's, group rq-web, setgid, none for others
    assert owner(box, "/var/lib/rq/queue/ua") == "rqalice rq-web 2750", why
    store = QueueStore(box.path("/var/lib/rq/queue/ua"))
    attached = store.attachments(state, msg_id)
    assert [p.read_text() for p in attached] == [SECRET]
    check_other_queues_cannot_read(box, inside(box, attached[0]))


def check_other_queues_cannot_read(box: Container, path: str) -> None:
    """A queue of user rq cannot read ``path`` (of queue ua); the console's groups can."""
    install(box, "ub", READER, {})
    _, state, status = run_one(box, "ub", "--param1", path)
    assert (state, status) == ("done", "refused: Permission denied"), (
        f"{state} {status}\n{journal(box, 'rq@ub.service')}")
    console = box.run("setpriv", "--reuid=rq", "--regid=rq", "--groups=rq-web", "cat", path,
                      check=False)
    assert (console.returncode, console.stdout) == (0, SECRET), console.stderr
    plain = box.run("setpriv", "--reuid=rq", "--regid=rq", "--groups=rq", "cat", path,
                    check=False)
    assert plain.returncode != 0 and "Permission denied" in plain.stderr, plain
    assert "rq-web" in box.show("rq-web.service", "SupplementaryGroups").split()


def test_a_dynamic_user_is_the_one_its_drop_in_names(box: Container) -> None:
    # Given queue ud with "user": "dynamic"
    install(box, "ud", WHO, {"user": "dynamic"})
    dropin = box.path(DROP_IN.format("ud"))
    wait_for(dropin.exists, 60, "the user drop-in of ud")
    lines = dropin.read_text().splitlines()
    assert "DynamicUser=yes" in lines, lines
    users = [x.split("=", 1)[1] for x in lines if x.startswith("User=")]
    assert len(users) == 1 and users[0], lines
    # When a message runs
    _, state, status = run_one(box, "ud")
    # Then as that user, from systemd's dynamic range, which owns the directory
    why = journal(box, "rq@ud.service", "rq-scan.service")
    found = re.fullmatch(r"user (\S+) uid (\d+) groups .*", status)
    assert state == "done" and found, f"{state} {status}\n{why}"
    assert found.group(1) == users[0], status
    uid = int(found.group(2))
    assert uid in DYNAMIC_UIDS, status
    top = box.run("stat", "-c", "%u %G %a", "/var/lib/rq/queue/ud").stdout.split()
    assert top == [str(uid), "rq-web", "2750"], why


def test_a_queue_without_its_user_runs_as_rq_again(ua: Container) -> None:
    # Given queue ua, its daemon running as rqalice
    box = ua
    assert run_one(box, "ua")[2].startswith("user rqalice ")
    first = box.show("rq@ua.service", "InvocationID")
    assert first and box.show("rq@ua.service", "ActiveState") == "active"
    dropin = box.path(DROP_IN.format("ua"))
    # When its config loses the user
    box.path(f"{OPT}/ua/config.json").write_text("{}")
    # Then the drop-in names no user, and the daemon is started again
    wait_for(lambda: "User=" not in read(dropin), 60,
             "the drop-in without User=")
    wait_for(lambda: box.show("rq@ua.service", "InvocationID") not in ("", first), 60,
             "rq@ua.service started again")
    # And the next message runs as rq, the directory rq's again
    msg_id, state, status = run_one(box, "ua")
    why = journal(box, "rq@ua.service", "rq-scan.service")
    assert state == "done" and status.startswith("user rq uid "), f"{status}\n{why}"
    assert main_uid(box, "ua") == uid_of(box, "rq"), why
    assert owner(box, "/var/lib/rq/queue/ua") == "rq rq 2770", why
    # And its audit trail goes on (the daemon, now rq, still writes its file)
    assert msg_id in audited(box, "ua"), why


def audited(box: Container, queue: str) -> str:
    """Queue ``queue``'s audit trail (its daemon writes it as it answers)."""
    return read(box.path(f"/var/lib/rq/audit/{queue}.jsonl"))


def test_a_queue_given_a_user_later_hands_it_all_over(box: Container) -> None:
    # Given queue ue of user rq, which has run a message
    install(box, "ue", WHO, {})
    before, _, status = run_one(box, "ue")
    assert status.startswith("user rq uid ") and before in audited(box, "ue"), status
    first = box.show("rq@ue.service", "InvocationID")
    # When its config names rqalice
    box.path(f"{OPT}/ue/config.json").write_text(json.dumps({"user": "rqalice"}))
    wait_for(lambda: "User=rqalice" in read(box.path(DROP_IN.format("ue"))), 60,
             "the drop-in of ue with User=rqalice")
    wait_for(lambda: box.show("rq@ue.service", "InvocationID") not in ("", first), 60,
             "rq@ue.service started again")
    # Then the next message runs as rqalice, in a directory all rqalice's
    msg_id, state, status = run_one(box, "ue")
    why = journal(box, "rq@ue.service", "rq-scan.service")
    assert state == "done" and status.startswith("user rqalice uid "), f"{status}\n{why}"
    found = box.run("find", "/var/lib/rq/queue/ue", "!", "-user", "rqalice").stdout
    assert found == "", f"not rqalice's:\n{found}\n{why}"
    assert owner(box, "/var/lib/rq/queue/ue") == "rqalice rq-web 2750", why
    # And its audit trail goes on
    assert msg_id in audited(box, "ue"), why


def read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def test_a_user_that_does_not_exist_runs_nothing_and_says_so(box: Container) -> None:
    # Given a queue whose user does not exist
    install(box, "ux", WHO, {"user": "no-such-user-rq"})
    store = QueueStore(box.path("/var/lib/rq/queue/ux"))
    # When a message is sent
    msg_id = send(box, "ux")
    # Then the journal names the problem
    wait_for(lambda: "does not exist" in journal(box, "rq@ux.service", "rq-scan.service"),
             60, "the journal saying the user does not exist")
    # And the message stays queued: no script ran
    time.sleep(3)
    why = journal(box, "rq@ux.service", "rq-scan.service")
    assert state_of(store, msg_id) == "que", why
    assert store.read_status("que", msg_id) == "", why
    assert not (store.msg_dir("que", msg_id) / "job").exists(), why


def test_a_batch_member_in_a_queue_of_its_own_user_records_its_end(box: Container) -> None:
    # Given queue uf run as rqalice
    install(box, "uf", WHO, {"user": "rqalice"})
    # When a batch has a member there
    out = box.run(RQ, "batch", "--file", "-", input=json.dumps({"messages": [{"dest": "uf"}]}))
    assert out.stdout.startswith("ok http://"), out.stdout
    ended = box.path(f"/var/lib/rq/batches/{out.stdout.strip().rsplit('/', 1)[1]}/ended.uf")
    # Then its daemon (rqalice, group rq) records the member's end in the batch
    wait_for(lambda: ended.exists() or "batch ends not written" in journal(
        box, "rq@uf.service"), ENDED, "the member's end, or why not")
    assert ended.exists(), journal(box, "rq@uf.service")
    assert ended.read_text().split()[1] == "done", ended.read_text()
