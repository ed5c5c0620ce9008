"""Credentials under a real booted systemd (tests/helpers/nspawn.py), the queue
daemon running as user ``rq``, as shipped.

rq-scan writes the queue's ``credentials`` as ``LoadCredential=`` and
``LoadCredentialEncrypted=`` in a drop-in of ``rq@<queue>.service``; systemd
reads the plain file and decrypts the one ``systemd-creds encrypt`` made in
the container (both readable by root only), and the script reads both in
``$CREDENTIALS_DIRECTORY``.  Neither secret is in the journal or the store.
Removing them from the config removes the drop-in and restarts the daemon:
the next script has no ``$CREDENTIALS_DIRECTORY``.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import need, wait_for
from nspawn import Container, booted_with_units, can_boot

from rqsys.run import credentials
from rqsys.store import QueueStore

VENV_BIN = Path(sys.executable).parent
RQ = str(VENV_BIN / "rq")
QUEUE = "sq"
DB = b"db-secret-" + secrets.token_hex(16).encode()
TOK = b"tok-secret-" + secrets.token_hex(16).encode()
SCRIPT = """\
#!/bin/sh
d="$CREDENTIALS_DIRECTORY"
env > env.dump
[ -n "$d" ] || { echo "done no credentials" >&3; exit 0; }
db=$(sha256sum < "$d/db") && tok=$(sha256sum < "$d/tok") || { echo "err unreadable" >&3; exit 1; }
echo "done db ${db%% *} tok ${tok%% *}" >&3
"""
CREDS = {"db": "/etc/rqtest/db", "tok": {"encrypted": "/etc/rqtest/tok.cred"}}


@pytest.fixture(scope="module")
def box() -> Iterator[Container]:
    """A container with rq-scan, a root-only secret and one systemd-creds encrypted."""
    reason = can_boot()
    need(not reason, reason)
    with booted_with_units(VENV_BIN.parent, "rq-scan.service") as box:
        box.run("install", "-d", "-m", "0700", "/etc/rqtest")
        box.run("sh", "-c", "umask 077 && cat > /etc/rqtest/db", input=DB.decode())
        box.run("systemd-creds", "encrypt", "--name=tok", "-", "/etc/rqtest/tok.cred",
                input=TOK.decode())
        assert TOK not in box.path("/etc/rqtest/tok.cred").read_bytes()  # encrypted indeed
        yield box


@pytest.fixture(scope="module")
def queue(box: Container) -> Container:
    """Queue sq, with a plain credential and an encrypted one."""
    install(box, {"credentials": CREDS})
    return box


def install(box: Container, cfg: dict[str, object]) -> None:
    entry = box.path(f"/opt/credtest/{QUEUE}")
    entry.mkdir(parents=True)
    (entry / "run").write_text(SCRIPT)
    (entry / "run").chmod(0o755)
    (entry / "config.json").write_text(json.dumps(cfg))
    box.run("ln", "-s", f"/opt/credtest/{QUEUE}", f"/var/lib/rq/scandir/{QUEUE}")
    wait_for(lambda: box.show(f"rq@{QUEUE}.socket", "ActiveState") == "active", 30,
             f"rq@{QUEUE}.socket active")


def run_one(box: Container) -> tuple[str, str, str]:
    """Send a message; (state, status, the env its script dumped)."""
    out = box.run(RQ, "sendmesg", "--dest", QUEUE).stdout.strip()
    assert out.startswith("ok http://"), out
    msg_id = out.rsplit("/", 1)[1]
    store = QueueStore(box.path(f"/var/lib/rq/queue/{QUEUE}"))
    state = wait_for(lambda: store.find(msg_id) if store.find(msg_id) in ("done", "err")
                     else None, 60, f"{msg_id} ended")
    env = (store.msg_dir(state, msg_id) / "job" / "env.dump").read_text()
    return state, store.read_status(state, msg_id), env


def test_a_script_reads_a_plain_and_an_encrypted_credential_and_neither_leaks(
        queue: Container) -> None:
    # Given a queue with a plain credential and an encrypted one
    box = queue
    dropin = box.path(f"/etc/systemd/system/rq@{QUEUE}.service.d/{credentials.DROP_IN_NAME}")
    wait_for(dropin.exists, 30, "the credentials drop-in")
    assert dropin.read_text().endswith("LoadCredential=db:/etc/rqtest/db\n"
                                       "LoadCredentialEncrypted=tok:/etc/rqtest/tok.cred\n")
    # When a message runs
    state, status, env = run_one(box)
    # Then its script read both, as systemd loaded (and decrypted) them
    digests = f"db {hashlib.sha256(DB).hexdigest()} tok {hashlib.sha256(TOK).hexdigest()}"
    journal = box.run("journalctl", "-u", f"rq@{QUEUE}.service", "--no-pager").stdout
    assert (state, status) == ("done", digests), journal
    assert f"{credentials.ENV}=/run/credentials/rq@{QUEUE}.service\n" in env
    # And neither secret is anywhere: the journal (every field), the store, the env
    everything = box.run("journalctl", "--no-pager", "-o", "export").stdout.encode()
    stored = [p for p in box.path("/var/lib/rq").rglob("*")
              if p.is_file() and not p.is_symlink()]
    for secret in (DB, TOK):
        assert secret not in everything
        assert [str(p) for p in stored if secret in p.read_bytes()] == []
        assert secret.decode() not in env


def test_credentials_removed_from_the_config_go_from_the_unit(queue: Container) -> None:
    # Given the queue, its daemon running, started with the credentials
    box = queue
    dropin = box.path(f"/etc/systemd/system/rq@{QUEUE}.service.d/{credentials.DROP_IN_NAME}")
    assert run_one(box)[1].startswith("db ") and dropin.exists()
    first = box.show(f"rq@{QUEUE}.service", "InvocationID")
    assert first and box.show(f"rq@{QUEUE}.service", "ActiveState") == "active"
    # When its config loses them
    box.path(f"/opt/credtest/{QUEUE}/config.json").write_text("{}")
    # Then the drop-in goes, and the daemon is started again (a reload would keep them)
    wait_for(lambda: not dropin.exists(), 30, "the drop-in removed")
    wait_for(lambda: box.show(f"rq@{QUEUE}.service", "InvocationID") not in ("", first), 30,
             "rq@sq.service started again")
    state, status, env = run_one(box)
    assert (state, status) == ("done", "no credentials")
    assert credentials.ENV not in env
