"""Credentials in embedded mode, with real processes: ``rqsys serve`` (its queue
daemons, rq-scan and the web) or a bare queue daemon, and real scripts that
read ``$CREDENTIALS_DIRECTORY/NAME``.

Each run gets a private directory (0700) of copies (0400), gone when it
ends, and after a crash at the daemon's next start; a file that cannot be
read ends the run in err, naming it, and the message can be retried; an
encrypted one is refused without systemd (one log line, nothing runs); and
the secret's bytes are nowhere to be found: not in the store, the log, the
web's pages and JSON, nor the environment the script dumps."""

from __future__ import annotations

import hashlib
import secrets
import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import wait_for
from daemon_util import job_file, write_gate
from scan_util import DEADLINE, LoggedProcess, call, make_entry, start_serve, started

from rqsys.run import credentials

READER = r"""
d="$CREDENTIALS_DIRECTORY"
{ echo "dir=$d"; stat -c 'dirmode=%a' "$d"; for f in "$d"/*; do
  stat -c "file=%n %a" "$f"; done; } > "$RQ_MSG_DIR/seen"
env > "$RQ_MSG_DIR/env.dump"
sum=$(sha256sum < "$d/db") || { echo "err cannot read db" >&3; exit 1; }
echo "done ${sum%% *}" >&3
"""
SUPERVISORS = "/run/credentials/rqsys-serve.service"  # serve's own, were it a unit's


@pytest.fixture
def secret(tmp_path: Path) -> bytes:
    value = b"rqsys-secret-" + secrets.token_hex(16).encode() + b"\n"
    path = tmp_path / "secrets" / "db"
    path.parent.mkdir()
    path.write_bytes(value)
    path.chmod(0o600)
    return value


@pytest.fixture
def serve(layout, tmp_path, monkeypatch) -> Iterator[LoggedProcess]:
    """``rqsys serve`` on a scandir of its own, started as if it were a unit with
    credentials of its own (which are not its queues')."""
    monkeypatch.setenv(credentials.ENV, SUPERVISORS)
    scandir = tmp_path / "scandir"
    scandir.mkdir()
    launch = started(lambda: start_serve(layout, scandir, tmp_path / "serve.log"))
    yield next(launch)()
    next(launch, None)


def add_queue(layout, tmp_path: Path, name: str, body: str, **cfg) -> None:
    """Link a queue into serve's scandir; wait until its socket is there."""
    entry = make_entry(tmp_path / "scripts", name, body, **cfg)
    (tmp_path / "scandir" / name).symlink_to(entry)
    wait_for(layout.socket_path(name).exists, DEADLINE, f"queue {name} served")


def run_to_end(layout, queue: str) -> tuple[str, dict]:
    msg_id = call(layout, queue, "create", msg={"dest": queue})["msg_id"]
    return msg_id, wait_for(lambda: _final(layout, queue, msg_id), DEADLINE, f"{msg_id} to end")


def _final(layout, queue: str, msg_id: str) -> dict | None:
    reply = call(layout, queue, "status", msg_id=msg_id)
    return reply if reply["state"] in ("done", "err") else None


def job_text(layout, queue: str, msg_id: str, name: str) -> str:
    return job_file(layout, queue, msg_id, name).read_text()


def web_get(serve: LoggedProcess, path: str) -> bytes:
    port = serve.proc.args[serve.proc.args.index("--port") + 1]  # type: ignore[union-attr]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=DEADLINE) as answer:
        assert answer.status == 200, path
        return bytes(answer.read())


def every_file(root: Path) -> Iterator[Path]:
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            yield path


def test_a_run_reads_its_private_copy_and_the_secret_leaks_nowhere(layout, tmp_path, secret,
                                                                   serve):
    # Given a queue with a plain credential, served by rqsys serve
    add_queue(layout, tmp_path, "cq", READER, credentials={"db": str(tmp_path / "secrets/db")})
    # When a message runs
    msg_id, reply = run_to_end(layout, "cq")
    # Then its script read the secret (its digest is the status)
    assert (reply["state"], reply["status"]) == ("done", hashlib.sha256(secret).hexdigest())
    # in a private directory of its own, on /run, with a read-only copy
    seen = dict(line.split("=", 1) for line in job_text(layout, "cq", msg_id, "seen").splitlines())
    run_dir = Path(seen["dir"])
    assert run_dir.is_relative_to(credentials.SYSTEM_BASE) and seen["dirmode"] == "700"
    assert seen["file"] == f"{run_dir}/db 400"
    # removed at its end, with the queue's and the root's directories that held it
    assert not run_dir.exists() and not run_dir.parent.exists()
    assert not run_dir.parent.parent.exists()
    # and its environment named that directory, not serve's own, and held no secret
    env = job_text(layout, "cq", msg_id, "env.dump")
    assert f"{credentials.ENV}={run_dir}\n" in env and SUPERVISORS not in env
    # Nowhere else is the secret: the whole root (store, logs), the log, the web
    pages = [web_get(serve, path) for path in
             ("/q/cq", "/q/cq/config.json", f"/q/cq/{msg_id}", "/q/cq/messages.json",
              "/q.json", "/")]
    assert b'"db"' in pages[1]  # the config names it (and its path) ...
    needle = secret.strip()
    leaks = [str(p) for p in every_file(layout.root) if needle in p.read_bytes()]
    leaks += ["serve's log"] if needle in serve.logfile.read_bytes() else []
    leaks += [f"web page {n}" for n, page in enumerate(pages) if needle in page]
    assert leaks == []  # ... never its content


def test_a_missing_credential_ends_the_run_in_err_naming_it(layout, tmp_path, secret, serve):
    # Given a queue whose second credential's file is not there
    gone = tmp_path / "secrets" / "api"
    add_queue(layout, tmp_path, "mq", READER,
              credentials={"db": str(tmp_path / "secrets/db"), "api": str(gone)})
    # When a message comes, Then it ends in err, the status naming the credential
    msg_id, reply = run_to_end(layout, "mq")
    assert reply["state"] == "err"
    assert reply["status"] == f"credential api: cannot read {gone}: No such file or directory"
    assert not job_file(layout, "mq", msg_id, "seen").exists()  # not run
    assert not list(credentials.SYSTEM_BASE.glob("*/mq/*"))  # db's copy removed too
    serve.wait_log(f"{msg_id}: err: credential api: cannot read")
    # And nothing is lost: once the file is there, the message is retried to done
    gone.write_bytes(b"api-key\n")
    call(layout, "mq", "retry", msg_id=msg_id)
    assert wait_for(lambda: _final(layout, "mq", msg_id), DEADLINE, "the retry")["state"] == "done"


def test_an_encrypted_credential_is_refused_without_systemd(layout, tmp_path, serve):
    # Given a queue with a credential only systemd can decrypt
    add_queue(layout, tmp_path, "eq", 'touch "$RQ_MSG_DIR/ran"; echo "done ran" >&3',
              credentials={"tok": {"encrypted": str(tmp_path / "tok.cred")}})
    # When a message is sent to it: it is taken, and stays queued
    msg_id = call(layout, "eq", "create", msg={"dest": "eq"})["msg_id"]
    serve.wait_log("only systemd decrypts")
    call(layout, "eq", "status", msg_id=msg_id)  # a turn after the create's
    assert call(layout, "eq", "status", msg_id=msg_id)["state"] == "que"
    # Then the log says why, in one line, once
    log = serve.log()
    assert log.count("credentials tok are encrypted, which only systemd decrypts "
                     "(LoadCredentialEncrypted= of rq@eq.service)") == 1, log
    assert "no message of this queue runs; messages stay queued" in log
    assert not list(layout.queue_dir("eq").rglob("ran"))


def test_a_crashed_daemons_run_directory_is_removed_when_it_starts_again(
        layout, make_queue, daemon, tmp_path, secret, monkeypatch):
    # Given a bare queue daemon (no systemd, no supervisor) running a message
    # that holds its credentials' directory until a gate opens
    monkeypatch.delenv(credentials.ENV, raising=False)
    gate, dirs = tmp_path / "gate", tmp_path / "dirs"
    make_queue("kq", f"""
        echo "$CREDENTIALS_DIRECTORY" >> {dirs}
        while [ ! -e {gate} ]; do sleep 0.05; done
        cat "$CREDENTIALS_DIRECTORY/db" > /dev/null && echo "done read" >&3
    """, credentials={"db": str(tmp_path / "secrets/db")})
    proc = daemon("kq")
    msg_id = call(layout, "kq", "create", msg={"dest": "kq"})["msg_id"]
    first = Path(wait_for(lambda: dirs.exists() and dirs.read_text().strip(), DEADLINE,
                          "the run's directory"))
    assert (first / "db").read_bytes() == secret
    # When the daemon is killed, and started again
    proc.kill(signal.SIGKILL)
    proc.proc.wait()
    assert first.exists()  # left behind
    again = daemon("kq")
    # Then the first run's directory is gone before anything runs, and said so
    assert not first.exists()
    wait_for(lambda: "credentials: removed 1 run directories a daemon left"
             in again.stderr_text(), DEADLINE, "the log's line")
    # and the message, run again, gets a new one, removed at its end
    write_gate(gate)
    assert wait_for(lambda: _final(layout, "kq", msg_id), DEADLINE, "the re-run")["state"] \
        == "done"
    second = Path(dirs.read_text().split()[-1])
    assert second != first and not second.exists()
